"""From built shards to batches: the one pipeline builder, augmentation, the tf.data service."""
