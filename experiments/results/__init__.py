"""What a run measures and writes: the recorder, the serving metrics and the result files."""
