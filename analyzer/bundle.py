"""Chain of custody: a bundle holds the report and a manifest from which the same audit can be
re-run later and compared, input hash by input hash and finding by finding."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from analyzer import __version__
from analyzer.api import open_sources
from analyzer.errors import AuditInputError
from analyzer.redact import Redactor
from analyzer.report.schema import Report
from analyzer.sources import DATABASE_URL, file_facts
from analyzer.sources.postgres import url_without_password

MANIFEST = "manifest.json"
REPORT = "report.json"


def _verdicts(report: Report) -> dict[str, Any]:
    """The parts of a report that must not change when the same inputs are audited again."""
    data = report.model_dump(mode="json")
    return {"runs": data["runs"], "findings": data["findings"], "summary": data["summary"]}


def write_bundle(
    folder: Path, sources: tuple[str, ...], options: dict[str, Any], report: Report, markdown: str
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "tool": f"dstack-audit {__version__}",
        "created_at": datetime.now(UTC).isoformat(),
        "sources": [
            url_without_password(s) if DATABASE_URL.match(s) else str(Path(s).resolve())
            for s in sources
        ],
        "options": options,
        "inputs": [
            {"path": i.path, "kind": i.kind, "sha256": i.sha256, "size": i.size}
            for i in report.inputs
        ],
        "schema_version": report.schema_version,
    }
    manifest = Redactor().apply_data(manifest)  # secret shapes (the report is redacted already)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (folder / REPORT).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    (folder / "report.md").write_text(markdown, encoding="utf-8")


@dataclass
class Verification:
    same: bool = True
    lines: list[str] = field(default_factory=list)

    def differ(self, line: str) -> None:
        self.same = False
        self.lines.append(line)


def verify_bundle(folder: Path) -> Verification:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        recorded = Report.model_validate_json((folder / REPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise AuditInputError(str(folder), f"not a dstack-audit bundle ({error})") from None
    result = Verification()
    if manifest.get("tool") != f"dstack-audit {__version__}":
        result.lines.append(
            f"note: bundle made by {manifest.get('tool')}, verified with dstack-audit {__version__}"
        )
    for item in manifest["inputs"]:
        path = Path(item["path"])
        if item.get("sha256") is None:
            continue
        if not path.exists():
            result.differ(f"input missing: {path}")
            continue
        now = file_facts(path, item["kind"]).sha256
        if now != item["sha256"]:
            result.differ(f"input changed: {path} sha256 {item['sha256']} -> {now}")
    if not result.same:
        return result
    options = dict(manifest.get("options") or {})
    for key in ("since", "until"):
        if options.get(key):
            options[key] = datetime.fromisoformat(options[key]).replace(tzinfo=UTC)
    if options.get("log_date"):
        options["log_date"] = date.fromisoformat(options["log_date"])
    again = open_sources(manifest["sources"], **options).report
    before, after = _verdicts(recorded), _verdicts(again)
    if before == after:
        result.lines.append(
            f"verified: {len(manifest['inputs'])} input(s) unchanged, the same "
            f"{len(recorded.findings)} finding(s) and {len(recorded.runs)} run verdict(s)"
        )
        return result
    old = {(f["run_id"], f["category"]): f for f in before["findings"]}
    new = {(f["run_id"], f["category"]): f for f in after["findings"]}
    for key in sorted(old.keys() - new.keys()):
        result.differ(f"finding no longer made: {key[1]} in run {key[0]}")
    for key in sorted(new.keys() - old.keys()):
        result.differ(f"new finding: {key[1]} in run {key[0]}")
    for key in sorted(old.keys() & new.keys()):
        if old[key] != new[key]:
            fields = sorted(k for k in old[key] if old[key][k] != new[key].get(k))
            result.differ(f"finding changed: {key[1]} in run {key[0]}: {', '.join(fields)}")
    old_runs = {r["run_id"]: r["verdict"] for r in before["runs"]}
    new_runs = {r["run_id"]: r["verdict"] for r in after["runs"]}
    for run_id in sorted(old_runs.keys() | new_runs.keys()):
        if old_runs.get(run_id) != new_runs.get(run_id):
            result.differ(f"run {run_id}: verdict {old_runs.get(run_id)} -> {new_runs.get(run_id)}")
    if result.same:
        result.differ("the report differs in its summary")
    return result
