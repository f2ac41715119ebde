"""keyturn_admit dropped: a new key is admitted after its lookup

A submission reads its key first and admits a new one by the admission
statement (keyturn.db.admission), so a replay is the lookup alone; the
function that admitted inside the lookup's own statement is no longer
called. Measured by ``python -m bench.cpu replay``: the lookup alone costs
a replay a tenth less server CPU and a third less database CPU than the
lookup with the function beside it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-18 09:00:00
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP FUNCTION keyturn_admit(text, uuid, text, uuid, text, text, text, text, text)")


def downgrade() -> None:
    # The function as 0014 made it, from 0014 itself: one copy of its text.
    path = Path(__file__).with_name("0014_admit_function.py")
    spec = importlib.util.spec_from_file_location("keyturn_migration_0014", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.upgrade()
