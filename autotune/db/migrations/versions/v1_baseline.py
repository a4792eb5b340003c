"""v1: the first released schema (tests/fixtures/v1.db): the tables `results`, `trials`,
`misses` and `schema_info`.

The base every upgrade starts from. It has no upgrade(): no database is ever upgraded to v1.
"""

revision = "1"
down_revision = None
