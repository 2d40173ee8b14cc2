"""Models the project makes itself (no download), for tests and for `bench run` on a laptop."""
