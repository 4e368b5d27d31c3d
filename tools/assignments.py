"""Instructor workflow: ``make assignments`` / ``make grade`` run this file.

The code is the ``course_grading`` package next to it (tools/course_grading/); run as a
script, this file's folder is on ``sys.path`` so the package imports as it is.
See ``python tools/assignments.py --help`` and book/instructor_guide.md.
"""

import sys

from course_grading.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
