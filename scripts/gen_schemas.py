"""Write the JSON Schemas of settings.json and model-settings.json to schemas/ (run after changing settings)."""

from __future__ import annotations

import json
from pathlib import Path

from runtime.settings import json_schemas

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    SCHEMAS.mkdir(exist_ok=True)
    for name, schema in json_schemas().items():
        (SCHEMAS / name).write_text(render(schema))
        print(f"wrote schemas/{name}")


if __name__ == "__main__":
    main()
