"""Data layer: readers -> format converters -> template rendering with loss masks ->
tokenised samples -> batches."""
