"""Dataset packages in the tensorflow-datasets layout (one folder per dataset)."""
