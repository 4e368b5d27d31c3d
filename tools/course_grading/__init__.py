"""Instructor tools: build otter assignments from the chapters and grade submissions.

Not part of the learner's package (``transformer_course``): nothing here is installed by
``pip install``. Run from the repository root as ``python tools/assignments.py ...``
(what ``make assignments`` / ``make grade`` do) or ``python -m course_grading ...`` with
``tools/`` on ``PYTHONPATH``. Explained in book/instructor_guide.md.

Modules:

- ``assign``: chapters' exercises -> otter master notebook -> ``otter assign``.
- ``grade``: every submission graded in a sandbox by ``otter run`` and the isolated
  re-check; writes grades.csv, otter_grades.csv, feedback/ and results.json.
- ``recheck``: the trusted side of the re-check (runs the checks, never the learner's code).
- ``worker``: the untrusted side (runs the learner's code, answers calls), always started
  inside the sandbox.
- ``sandbox``: the bubblewrap sandbox (``--sandbox auto|bwrap|none``).
- ``wire``: framed messages between the two sides (``torch.load(weights_only=True)``).
"""
