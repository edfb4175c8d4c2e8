"""Measured: the teacher's lead over the gold-only student on dev, and AugSBERT - gold only on
test (paired bootstrap, 90% interval), per run. Written by benchmarks/teacher_lead.py from
benchmarks/results/heldout_recipe_matched.json:gold10,
benchmarks/results/mpnet_teacher_lowres.json:silver-first,
benchmarks/results/pilot_check_mrpc_mpnet.json,
benchmarks/results/mrpc_1k_mpnet.json; do not edit by hand
"""

MEASURED = (
    {'task': 'stsb', 'teacher': 'MiniLM teacher', 'seed': 1, 'metric': 'spearman', 'lead_dev': 2.1, 'gain_test': -0.23, 'low': -1.48, 'high': 1.08},
    {'task': 'stsb', 'teacher': 'MiniLM teacher', 'seed': 2, 'metric': 'spearman', 'lead_dev': 2.44, 'gain_test': 1.96, 'low': 0.72, 'high': 3.19},
    {'task': 'news', 'teacher': 'MiniLM teacher', 'seed': 2, 'metric': 'spearman', 'lead_dev': 3.17, 'gain_test': 2.88, 'low': 0.92, 'high': 5.17},
    {'task': 'news', 'teacher': 'MiniLM teacher', 'seed': 1, 'metric': 'spearman', 'lead_dev': 3.28, 'gain_test': 2.3, 'low': 0.28, 'high': 4.29},
    {'task': 'stsb', 'teacher': 'MPNet teacher, silver first', 'seed': 1, 'metric': 'spearman', 'lead_dev': 5.31, 'gain_test': 2.36, 'low': 1.33, 'high': 3.46},
    {'task': 'stsb', 'teacher': 'MPNet teacher, silver first', 'seed': 2, 'metric': 'spearman', 'lead_dev': 5.65, 'gain_test': 3.17, 'low': 1.92, 'high': 4.43},
    {'task': 'captions', 'teacher': 'MPNet teacher, silver first', 'seed': 1, 'metric': 'spearman', 'lead_dev': 7.63, 'gain_test': 3.08, 'low': 1.98, 'high': 4.31},
    {'task': 'captions', 'teacher': 'MPNet teacher, silver first', 'seed': 2, 'metric': 'spearman', 'lead_dev': 7.64, 'gain_test': 3.83, 'low': 2.72, 'high': 5.12},
    {'task': 'news', 'teacher': 'MPNet teacher, silver first', 'seed': 2, 'metric': 'spearman', 'lead_dev': 10.14, 'gain_test': 2.41, 'low': 0.87, 'high': 4.15},
    {'task': 'news', 'teacher': 'MPNet teacher, silver first', 'seed': 1, 'metric': 'spearman', 'lead_dev': 10.25, 'gain_test': 3.0, 'low': 1.25, 'high': 4.64},
    {'task': 'mrpc-1k-mpnet', 'teacher': 'MPNet teacher, silver first', 'seed': 1, 'metric': 'f1', 'lead_dev': 0.4, 'gain_test': 0.5, 'low': -0.04, 'high': 1.04},
    {'task': 'mrpc-1k-mpnet', 'teacher': 'MPNet teacher, silver first', 'seed': 2, 'metric': 'f1', 'lead_dev': 1.09, 'gain_test': -0.46, 'low': -1.02, 'high': 0.12},
    {'task': 'mrpc-bm25', 'teacher': 'MPNet teacher', 'seed': 1, 'metric': 'f1', 'lead_dev': 7.78, 'gain_test': -1.14, 'low': -1.79, 'high': -0.55},
    {'task': 'mrpc-bm25', 'teacher': 'MPNet teacher', 'seed': 2, 'metric': 'f1', 'lead_dev': 7.85, 'gain_test': -1.53, 'low': -2.29, 'high': -0.74},
)
