# Every recipe CI runs lives here, so a developer runs exactly what CI runs.
CARGO ?= cargo

.PHONY: chaos-dsj
.PHONY: demo test helm-env browser-env build fmt-check lint footprint crds bench-latency bench-dsj-latency bench-fleet e2e-fleet charts

## The main job: a local simulated fleet with a live view (kedge-sim up). The debug build is
## the one `make test` makes, so after either the other starts without building again.
demo:
	@if [ -x target/debug/kedge-sim ]; then \
		echo "make demo: checking the build of the workspace binaries in target/debug (seconds when up to date); cargo's progress follows"; \
	else \
		echo "make demo: building the workspace binaries in target/debug; a first build takes about 8 minutes on 2 cores, later ones seconds; cargo's progress follows"; \
	fi
	$(CARGO) build --workspace --bins
	target/debug/kedge-sim up --dir .kedge-fleet

## The whole test suite (README's second command; .ci/run calls it): every test binary
## `cargo test --workspace` runs, three at a time (KEDGE_TEST_JOBS), logs in target/test-logs.
test: fmt-check helm-env browser-env
	$(CARGO) build --workspace --bins
	python3 scripts/run-tests.py

## The chart tests' Python (pinned helm-python-sdk and kubernetes-validate) in target/pyenv;
## reused when present (tests/tests/charts.rs).
helm-env:
	bash scripts/helm-env.sh >/dev/null

## The browser tests' headless Chromium: Debian's `chromium` package, installed with apt
## (as root, or through sudo) when /usr/bin/chromium is absent (tests/tests/browser/).
browser-env:
	bash scripts/browser-env.sh >/dev/null

build:
	$(CARGO) build --release --workspace --bins

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Agent binary size, idle RSS, and RSS with 1,000 managed Jobs (docs/performance.md
## "Footprint"); the bench fails when the agent reaches 20 MiB with the Jobs. Then the hub's
## memory and CPU with 0 and 100 enrolled agents and 10 DSOs (docs/performance.md "Sizing
## the hub").
footprint:
	bash scripts/footprint.sh
	$(CARGO) build --release --workspace --bins
	KEDGE_AGENT_BIN=$(CURDIR)/target/agent/kedge-agent $(CARGO) bench -p kedge-e2e --bench agent_jobs_rss
	$(CARGO) bench -p kedge-e2e --bench hub_footprint

## Regenerate deploy/crds from the Rust types (a test fails when they drift) and copy them
## into the hub chart (tests/tests/charts.rs fails when its copy differs).
crds:
	KEDGE_UPDATE_CRDS=1 $(CARGO) test -q -p kedge-core --test crd_yaml
	cp deploy/crds/*.yaml deploy/charts/kedge-hub/crds/

## The chart archives to publish (helm package), in target/charts. The archives of the last
## published release stay in tests/tests/fixtures/charts: the upgrade test starts from them.
charts: helm-env
	mkdir -p target/charts
	for c in deploy/charts/*/; do echo '{}' | target/pyenv/bin/python scripts/helm_chart.py package "$$c" target/charts; echo; done

## /scale change to replicas in every member, end to end (docs/performance.md "Scaling
## latency").
bench-latency:
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p kedge-e2e --bench scale_latency

## One hub and many virtual agents (real QUIC, mTLS and protocol, in one process): connect
## time, hub memory per member, /scale fan-out latency (docs/performance.md "Fleet scale").
## FLEET_BENCH_MEMBERS=100,1000,10000 sets the member counts.
bench-fleet:
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p kedge-e2e --bench fleet_scale

## The fleet-scale end-to-end test with 1,000 members (the suite runs it with 20): the real
## hub, one real agent process per member, kedge-sim, the real kubectl; prints each step's time.
## KEDGE_E2E_MEMBERS sets the count.
e2e-fleet:
	$(CARGO) build --release --workspace --bins
	KEDGE_E2E_MEMBERS=$${KEDGE_E2E_MEMBERS:-1000} $(CARGO) test --release -p kedge-e2e --test fleet_members_e2e -- --nocapture

## Queue change to Jobs running in the members, end to end (docs/dsj.md "Latency").
bench-dsj-latency:
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p kedge-e2e --bench dsj_latency

## Exactly-once Jobs, longer than CI runs it: 20 members, 6 restart rounds and a 10-minute
## hub outage (docs/dsj.md "Exactly-once Jobs"); about 15 minutes.
chaos-dsj:
	$(CARGO) build --workspace --bins
	KEDGE_CHAOS_MEMBERS=20 KEDGE_CHAOS_ROUNDS=6 KEDGE_CHAOS_OUTAGE_S=600 \
		$(CARGO) test -p kedge-e2e --test dsj_restart_e2e -- --nocapture
