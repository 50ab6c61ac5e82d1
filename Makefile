# The two commands a new machine needs are `make quickstart` and `make test`; both set everything up first.
.PHONY: setup quickstart quickstart-real distill-quickstart demo test test-slow test-browser bench bench-trl bench-trl-real tinker-cookbook-check docs docs-with-outputs

setup:
	scripts/setup.sh

quickstart: setup
	HF_HUB_OFFLINE=1 WANDB_MODE=offline .venv/bin/rlkit train quickstart

# The real-model recipe: SmolLM2-135M-Instruct (from its pinned wheel, converted once) on 2-digit arithmetic in chat form
quickstart-real: setup
	HF_HUB_OFFLINE=1 WANDB_MODE=offline .venv/bin/rlkit train smollm2_quickstart

# on-policy distillation: the quickstart's RL-trained model (trained and exported first, once) teaches the same model
# after its SFT warm start
distill-quickstart: setup
	test -f models/quickstart-teacher/config.json || HF_HUB_OFFLINE=1 WANDB_MODE=offline .venv/bin/rlkit train \
		--export models/quickstart-teacher quickstart
	HF_HUB_OFFLINE=1 WANDB_MODE=offline .venv/bin/rlkit train distill_quickstart

demo: setup
	HF_HUB_OFFLINE=1 .venv/bin/rlkit demo

test:
	scripts/test.sh default

test-slow:
	scripts/test.sh slow

test-browser:
	scripts/test.sh browser

# The docs site (MkDocs Material, offline) into build/site; --strict: a broken link or missing reference fails it
# Tutorials are rendered with the outputs of the last tutorial test run (test-output/tutorials/), else without
docs: setup
	scripts/setup-docs.sh
	NO_MKDOCS_2_WARNING=1 HF_HUB_OFFLINE=1 .venv/bin/mkdocs build --strict

# The same site with every tutorial's outputs: executes the tutorials first (their tests), then builds; a tutorial
# that fails is rendered without outputs, with a note
docs-with-outputs:
	-scripts/test.sh default tests/tutorials/test_tutorials.py -k runs_and_its_checks_pass
	$(MAKE) docs

bench: setup
	HF_HUB_OFFLINE=1 .venv/bin/python bench/run_all.py

# rlkit against TRL's GRPOTrainer side by side (TRL in its own environment, bench/.venv-trl, not in rlkit's lock)
bench-trl: setup
	scripts/setup-bench-trl.sh
	HF_HUB_OFFLINE=1 .venv/bin/python bench/vs_trl.py --shape tiny

# tinker-cookbook's RL recipe (math_rl, env=arithmetic) run unchanged against `rlkit serve-tinker`'s service: reward per
# step (the cookbook in its own environment, bench/.venv-tinker, not in rlkit's lock; ~1-3 min on 2 CPU cores)
tinker-cookbook-check: setup
	scripts/setup-tinker-cookbook.sh
	HF_HUB_OFFLINE=1 .venv/bin/python bench/tinker_cookbook_rl.py --steps 6

# the same on a real model: SmolLM2-135M-Instruct, adapters on both sides, held-out accuracy over 3 seeds (slow: ~hours)
bench-trl-real: setup
	scripts/setup-bench-trl.sh
	HF_HUB_OFFLINE=1 .venv/bin/python bench/vs_trl_real.py --learn
