# The package chooses the native allocators before pyarrow and deltalake load
# (`rollup_assets/__init__.py`); imported before the fixtures import pyarrow, the tests' process
# allocates as the product's processes do.
import rollup_assets  # noqa: F401
