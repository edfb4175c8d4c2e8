"""Fine-tuning both encoders: pure objectives, a plain loop, and the Ray Train edge."""
