"""Builds of engines from source that the project makes itself, cached per version and flags.

Each module here owns one engine's build: where its source comes from (a package registry),
the exact flags, the cache layout, and the build id that the manifest records. Import from
the module (`engines.builds.llamacpp`); this package imports nothing so that
`python -m engines.builds.llamacpp` runs the module only once.
"""
