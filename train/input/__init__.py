"""From built shards to batches: TFRecord framing, the one pipeline builder, augmentation, the tf.data service."""
