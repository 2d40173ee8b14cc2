"""The `bench` console script: a thin layer that parses arguments and calls the parts."""
