"""The metadata store (the control plane): fleet and run tables (``models``), people and their
tokens (``accounts``), run metrics (``metrics``), run records and their state changes
(``runs``), the engine, migrations and atomic operations (``metadata_store``)."""

# Every table module, so Base.metadata (and Alembic's comparison) holds the whole schema
# whichever module a process imports first.
from foundation.store import accounts, help_requests, metrics, models  # noqa: F401
