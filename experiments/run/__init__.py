"""Running an experiment: a composed config -> settings -> engine -> replay -> result files."""
