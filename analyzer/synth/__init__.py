"""Synthetic dstack 0.22.5 servers: many runs, in dstack's exact formats, with ground truth.

The real captures (``tests/data/captures/v0.22.5``) hold one run each. Benchmarks and fleet-wide
audits need servers with thousands of runs, so ``synthesize`` writes one: a ``server.db`` whose
schema is copied statement by statement from a capture's ``sqlite_master`` and whose rows are
the captures' rows with ids, names, times and projects rewritten (reference section 2
encodings; JSON documents rendered from the captures' own documents, every key present), the
server log of the same history in the three layouts of reference 9.2, and a ``truth.json`` in
the captures' format. What it takes from the captures ships as ``data/templates.json``.

Every run follows one of the captured stories (reference 7, 11.4), with the event messages of
reference 8.2 and the delays seen in the 0.22.5 captures: rolling deployments that succeed or
fail (no capacity, container crash, retry limit), healthy replicas killed by a newer
deployment's failure (1..6 victims, with and without probes), two successive updates, in-place
bumps and scale-ups, old replicas failing by themselves, user stops, tasks, runs re-submitted
under the same name, instances idling out, and runs still active when the snapshot ends.

Everything is drawn from one seed: the same seed gives the same bytes. Generation streams:
runs are simulated in submission order in batches, and log records are sorted and written as
soon as no later run can produce an earlier one.

Needs the 'synth' extra (numpy): ``pip install 'dstack-audit[synth]'``.
"""

from analyzer.synth.generate import SynthSummary, synthesize
from analyzer.synth.logs import rich_fold
from analyzer.synth.templates import Templates

__all__ = ["SynthSummary", "Templates", "rich_fold", "synthesize"]
