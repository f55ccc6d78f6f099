"""Write the JSON Schemas of settings.json and model-settings.json to schemas/ (run after changing settings)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's runtime/, whatever is installed

from runtime.settings import json_schemas  # noqa: E402

SCHEMAS = ROOT / "schemas"


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    SCHEMAS.mkdir(exist_ok=True)
    for name, schema in json_schemas().items():
        (SCHEMAS / name).write_text(render(schema))
        print(f"wrote schemas/{name}")


if __name__ == "__main__":
    main()
