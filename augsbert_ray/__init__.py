"""augsbert-ray: Augmented SBERT (Thakur et al., NAACL 2021) on Ray.

A cross-encoder trained on a small gold set labels sampled sentence pairs ("silver"),
and a bi-encoder trains on gold + silver. See README.md and ``augsbert --help``.
"""

__version__ = "0.1.0"
