"""Problems: the loaders of local files and hub sets, the presets, the built-in arithmetic generator."""
