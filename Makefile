# The course lab's entry points. A newcomer needs two:  make lab   and   make test
# Everything runs from .venv, created on first use by scripts/setup.sh (idempotent).
# The default stack is Python 3.12 with TensorFlow 2.21 (STACK=2.21); STACK=2.15: every target on the
# stack of classes that began on it instead (Python 3.11, TensorFlow 2.15.1, in .venv-2.15;
# scripts/stacks.sh names the stacks).
SHELL := /bin/bash
STACK ?= 2.21
VENV  ?= $(if $(filter 2.15,$(STACK)),.venv-2.15,.venv)
PY    := $(VENV)/bin/python
# the nbgrader course the instructor targets use (release, check-release, autograde, grades, feedback)
COURSE ?= grading
export VENV STACK

.DEFAULT_GOAL := help
.PHONY: help setup lab lint test test-fast test-stack test-slow run release check-release student-repo autograde grades slides ta-pages walkthroughs feedback doctor bench lock clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 16

setup:  ## create .venv with the pinned stack and Horovod (GPU=1 for CUDA; PYTHON=... to choose python3.12; STACK=2.15: Python 3.11, TF 2.15.1 in .venv-2.15)
	@bash scripts/setup.sh

lab:  ## start JupyterLab on the student notebooks (PORT=, IP=, NOTEBOOKS= optional)
	@bash scripts/lab.sh --check-args
	@$(MAKE) --no-print-directory setup release
	@bash scripts/lab.sh

lint: setup  ## ruff: lint and format check of the whole tree (configured in pyproject.toml); hadolint: deploy/'s Dockerfiles
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint deploy/*/Dockerfile

test: setup lint  ## lint, then the whole test suite (unit, process, notebook); PYTEST_ARGS=... to narrow it
	$(PY) -m pytest $(PYTEST_ARGS)

# what proves a stack, run on the one that is not the default by .ci/run (issue 56): the unit
# tests, and the process tests of the cluster, MPI, Horovod, the four methods' equal weights and
# the towers
STACK_TESTS := tests/unit tests/process/test_cluster.py tests/process/test_mpi_jobs.py tests/process/test_allreduce.py tests/process/test_towers.py

test-stack: setup  ## on STACK=...: the unit tests and the process tests that prove a stack (cluster, MPI, Horovod, four methods, towers); PYTEST_ARGS=...
	$(PY) -m pytest $(STACK_TESTS) $(PYTEST_ARGS)

test-slow:  ## make test on a machine made slower: a CPU quota of CPUS cores (default 0.8; root), else busy loops beside it
	@bash scripts/slow-test.sh

test-fast: setup  ## unit tests only (seconds)
	$(PY) -m pytest -m "not process and not notebook" $(PYTEST_ARGS)

run: setup  ## execute every lab with papermill (LABS=01,03 to choose; FULL=1 for full parameters)
	$(PY) -m lab_utils.run_labs --out out/run $(if $(LABS),--labs $(LABS)) $(if $(filter 1,$(FULL)),--full)

release: setup  ## regenerate the student notebooks in labs/ from grading/source/
	$(PY) -m lab_utils.grading --root $(COURSE) release

check-release: setup  ## fail if labs/ is out of date with grading/source/
	$(PY) -m lab_utils.grading --root $(COURSE) check-release

student-repo: setup  ## write (or update) DEST=path: the public student repository (labs, lab_utils, binder; no solution), committed; REFERENCES=02_ps_async publishes a lab's reference scripts after its due time
	@[ -n "$(DEST)" ] || { echo "make student-repo: give DEST=path (a new folder, or one it wrote before)" >&2; exit 2; }
	$(PY) -m lab_utils.grading --root $(COURSE) student-repo "$(DEST)" $(if $(REFERENCES),--references "$(REFERENCES)")

autograde: setup  ## grade SUBMISSIONS=folder (<student>/<lab>/<lab>.ipynb), each in a sandbox, in parallel, resumable (JOBS=, REGRADE=1; SLURM=1: as Slurm job arrays; UNSAFE_NO_SANDBOX=1: grade without root, as you)
	@test -n "$(SUBMISSIONS)" || { echo "autograde: give the folder of submissions: make autograde SUBMISSIONS=path (<student>/<lab>/<lab>.ipynb)" >&2; exit 2; }
	$(PY) -m lab_utils.grading --root $(COURSE) autograde $(SUBMISSIONS) $(if $(JOBS),--jobs $(JOBS)) $(if $(filter 1,$(REGRADE)),--regrade) $(if $(filter 1,$(SLURM)),--slurm) $(if $(filter 1,$(UNSAFE_NO_SANDBOX)),--unsafe-no-sandbox)

walkthroughs: setup  ## grading/walkthrough/<lab>.md, for instructors: each exercise's solution, its common mistakes with the messages the visible tests give, hints
	$(PY) -m lab_utils.grading --root $(COURSE) walkthroughs $(if $(LABS),--labs $(LABS))

slides: setup  ## slides/build/: the lecture decks (slides/<lab>.ipynb) as reveal.js, served from an installed npm package, no internet needed; FIGURES_FROM=dir TIER="..." takes the labs' figures from executed notebooks first (with LABS=07: that lab's only, the others' kept)
	$(PY) -m lab_utils.grading slides $(if $(LABS),--labs $(LABS)) $(if $(FIGURES_FROM),--figures-from "$(FIGURES_FROM)" --tier "$(TIER)")

ta-pages: setup  ## grading/ta/: each submission's written answers beside the outputs they refer to (as handed in) and their rubrics
	$(PY) -m lab_utils.grading --root $(COURSE) ta-pages $(if $(LABS),--labs $(LABS))

grades: setup  ## export the gradebook to grading/grades.csv (LMS=canvas or moodle: grading/<lms>.csv for that LMS's import)
	$(PY) -m lab_utils.grading --root $(COURSE) export $(if $(LMS),--lms $(LMS) --csv $(COURSE)/$(LMS).csv,--csv $(COURSE)/grades.csv)

feedback: setup  ## generate feedback HTML for autograded submissions
	$(PY) -m lab_utils.grading --root $(COURSE) feedback

doctor: setup  ## check Python, TensorFlow, Horovod, MPI, cores, memory, GPUs
	$(PY) -m lab_utils doctor

bench: setup  ## run the benchmarks (JSON in bench/results/)
	@mkdir -p bench/results
	@set -e; for b in bench/bench_*.py; do n=$$(basename $$b .py); echo "==> $$n"; \
	  $(PY) $$b | tee bench/results/$$n.json; done

lock:  ## resolve requirements/base.in + dev.in into requirements/constraints.txt, keeping locked versions (UPGRADE=1: all newest; STACK=2.15: constraints-2.15.txt)
	@UPGRADE=$(UPGRADE) bash scripts/lock.sh

clean:  ## remove run outputs, logs and course state (keeps .venv)
	rm -rf out bench/results grading/release grading/reference grading/submitted grading/autograded grading/feedback grading/results grading/slurm grading/gradebook.db
	$(PY) -m lab_utils reap
