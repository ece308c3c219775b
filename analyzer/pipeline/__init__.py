"""The pipeline: functions from the canonical frames to verdicts, findings and their impact.

Imports only the contract, the model and the sources below it (the layer test checks).
"""
