"""Tooling for cpr's tests, demos, benchmarks and reports; not part of the library (``cpr`` never imports it).

* :mod:`cpr_tools.tiny_models`: tiny Qwen2.5-VL / InternVL models built from configs with random weights,
  ``tiny:<kind>`` names, the demo configs' models (``python -m cpr_tools.tiny_models --demo``).
* :mod:`cpr_tools.step_pairs`: prediction / reference step pairs built from the real samples in ``data/samples``.
* :mod:`cpr_tools.demo_phase`: the demo config's CPR phase set up for the step-time benchmarks.

Installed with cpr (``pip install -e ".[dev]"``); from a checkout that is not installed, the repository
root on ``PYTHONPATH`` provides it.
"""
