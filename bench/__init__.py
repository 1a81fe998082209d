"""The benchmark (`python -m bench`, `make bench`): docs/performance.md."""

# The package chooses the native allocators before pyarrow and deltalake load
# (`rollup_assets/__init__.py`): imported first, the benchmark's process allocates as the
# product's processes do.
import rollup_assets  # noqa: F401
