"""What every pipeline shares: the knobs of reading, shuffling, batching and prefetching (knobs.py), the one TFRecord
reader and the tf.data options (reader.py), the tf.data service (service.py). Each workload builds its own pipeline
from these (train/workloads/<name>/pipeline.py)."""
