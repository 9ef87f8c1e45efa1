"""companion_grader: the instructor's side of the course's graded exercises.

Installed apart from the learner's package (``pip install -e ./grader`` from the
repository root, in an environment where the course package ``companion`` is
installed); a learner never needs it. It grades a folder of submitted exercise
notebooks without trusting them, and writes the exercise notebooks from the
solution notebooks::

    python -m companion_grader grade submissions/ [--roster roster.csv]
    python -m companion_grader gradescope CHAPTER -o build/
    python -m companion_grader make-exercises [--check]

* :mod:`.instructor`: the batch grader (one row per file, at any depth: status, points, flags)
* :mod:`.gradebook`: one row per student per chapter (nbgrader's columns) and Canvas's import CSV
* :mod:`.gradescope`: the autograder zip for Gradescope and the command its ``run_autograder`` runs
* :mod:`.sandbox`: starts a submission's worker with limits, under bubblewrap where it works
* :mod:`.worker`: the untrusted process that runs a submission's cells and answers calls
* :mod:`.remote`: the wire between them (plain data back, proxies for the student's objects)
* :mod:`.authoring`: solution notebooks to exercise notebooks (nbgrader's markers)

The exercises themselves, their cases and expected answers, are the course's
(``companion.grading.chNN``), run here in the grader's own process. The
dependency goes one way: this package imports ``companion``, never the reverse.
"""
