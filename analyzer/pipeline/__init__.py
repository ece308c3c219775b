"""The pipeline: functions from the canonical frames to verdicts, findings and their impact.

Imports only the contract, the model and the sources below it (the layer test checks).
"""

ENGINE = "in-memory"
"""The polars engine a function's ops, gathered into one lazy query, are collected on, whatever
the input's size: the one they ran on as eager ops (a frame's own ops run in memory). Polars'
own choice (`auto`, the streaming one on inputs of 4 MB or more) ran timeline.deployments and
_creation_deployments at about 1.5 times the cost on a 2k-run log."""
