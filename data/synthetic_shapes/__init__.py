"""The built-in synthetic shapes dataset."""

from data.synthetic_shapes.synthetic_shapes_dataset_builder import Builder, SyntheticShapesConfig, config_for

__all__ = ["Builder", "SyntheticShapesConfig", "config_for"]
