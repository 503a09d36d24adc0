# Tether. `make run` boots a node; `make test` runs everything CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := build

# The smallstep authority pulls badger, bbolt and mysql drivers unless told
# not to; these tags cut its dependency tree to what Tether uses.
TAGS := nobadger,nobbolt,nomysql
export GOFLAGS := -tags=$(TAGS)
export CGO_ENABLED := 0

BIN    := bin
BUILD  := build
KERNEL := .cache/kernel
PROTO  := proto/tether/v1

.PHONY: build generate lint test unit e2e bench bench-boot bench-peers fuzz probe chaos rolling run initramfs modules kernel clean screenshots

build: ## Build tetherd, tetherctl and tether-agent into bin/
	go build -trimpath -o $(BIN)/ ./cmd/tetherd ./cmd/tetherctl
	# grpcnotrace drops gRPC's tracing support: 2.7 MB off the agent in the initramfs.
	go build -trimpath -tags grpcnotrace,$(TAGS) -ldflags='-s -w' -o $(BIN)/tether-agent ./cmd/tether-agent

generate: ## Regenerate the gRPC code (protoc + the go.mod-pinned plugins)
	protoc -I proto -I /usr/include \
	  --plugin=protoc-gen-go=$$(go tool -n protoc-gen-go) \
	  --plugin=protoc-gen-go-grpc=$$(go tool -n protoc-gen-go-grpc) \
	  --go_out=. --go_opt=module=github.com/tetherfleet/tether \
	  --go-grpc_out=. --go-grpc_opt=module=github.com/tetherfleet/tether \
	  $(PROTO)/*.proto

lint: ## gofmt + go vet + a tidy go.mod + nothing in the repository names a path outside it
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	@# tidy ignores build tags on purpose (it keeps every tag's requirements), so
	@# it checks the same go.mod whatever GOFLAGS says.
	@go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy'"; exit 1; }
	go vet ./...
	go test -count=1 ./internal/testkit/repocheck/

test: lint unit e2e ## Everything: lint, unit and integration tests (both stores), real-VM e2e

unit: ## Unit and in-process integration tests, with the race detector on the concurrent core
	go test -count=1 -timeout 20m ./...
	@# The race pass leaves out the one real-VM test among them: it boots
	@# QEMU under TCG for over a minute, and its concurrency is tetherd's,
	@# which the other tests of the package drive under the detector.
	CGO_ENABLED=1 go test -count=1 -race -timeout 20m -skip '^TestQEMURealThroughTetherd$$' ./controlplane/... ./agent/session/... ./agent/modules/...

e2e: build initramfs modules ## Real-VM end-to-end tests (QEMU); skips loudly without qemu
	TETHER_E2E=1 go test -count=1 -timeout 30m -v ./e2e/...

bench: ## Benchmarks recorded in docs/benchmarks.md
	go test -run '^$$' -bench . -benchtime 1x ./controlplane/... ./agent/...

BOOT_PAIRS ?= 5
BOOT_ROOT  ?= example
BOOT_MODE  ?= direct
bench-boot: initramfs modules ## Boot to running against the bare-netboot floor, alternated (docs/benchmarks.md); BOOT_PAIRS=5, BOOT_ROOT=example|debian, BOOT_MODE=direct|bios|uefi
	scripts/bench-boot.sh $(BOOT_PAIRS) $(BOOT_ROOT) $(BOOT_MODE)
# The peer of `tether-bench peers`, built once into the repository's cache
# folder. Its own build tags (GOFLAGS cleared): step-ca's default database
# is badger, which Tether's tags leave out.
PEERS          := .cache/peers
STEPCA_VERSION := v0.30.2
PEERS_FLAGS    ?=
bench-peers: ## step-ca and tetherd side by side, alternating (docs/benchmarks.md); PEERS_FLAGS=--anyway on a busy machine
	@if ! go version -m $(PEERS)/bin/step-ca 2>/dev/null | grep -q 'github.com/smallstep/certificates[[:space:]]*$(STEPCA_VERSION)'; then \
	  echo "installing step-ca $(STEPCA_VERSION) into $(PEERS)/bin (once; it takes minutes)"; \
	  GOFLAGS= GOBIN=$(CURDIR)/$(PEERS)/bin go install github.com/smallstep/certificates/cmd/step-ca@$(STEPCA_VERSION); \
	fi
	go build -trimpath -o $(BIN)/ ./cmd/tetherd ./cmd/tether-bench
	$(BIN)/tether-bench peers --step-ca $(PEERS)/bin/step-ca --tetherd $(BIN)/tetherd --dir $(PEERS)/run $(PEERS_FLAGS)

fuzz: ## A short run of every fuzz target
	scripts/fuzz.sh 20s

probe: build ## Replay issue 26's attacks (TFTP/DHCP one-packet crashes, connection floods, idle keep-alives, random MACs) against a real tetherd; about a minute, loopback or a namespace it removes
	TETHER_PROBE=1 go test -count=1 -timeout 5m -v -run '^TestProbe$$' ./e2e/

rolling: ## A rolling upgrade on PostgreSQL: the build before the newest migration (a git worktree) runs its conformance suite on HEAD's schema, then serves beside HEAD for a minute under load (docs/operator-guide.md, Upgrades)
	go build -trimpath -o $(BIN)/ ./cmd/tetherd ./cmd/tether-bench
	TETHER_ROLLING=1 go test -count=1 -timeout 15m -v -run '^TestRollingUpgrade$$' ./e2e/

CHAOS_DURATION ?= 2m
CHAOS_STORE    ?= sqlite
chaos: ## kill -9 a real tetherd under load, then check the invariants (docs/reliability.md); CHAOS_DURATION=30m CHAOS_STORE=postgres is the long form
	go build -trimpath -o $(BIN)/ ./cmd/tetherd ./cmd/tether-bench
	$(BIN)/tether-bench chaos --tetherd $(BIN)/tetherd --duration $(CHAOS_DURATION) --store $(CHAOS_STORE) $(if $(filter sqlite,$(CHAOS_STORE)),--backup)

kernel: ## Debian's cloud kernel into .cache/kernel (never installed into /boot)
	scripts/fetch-kernel.sh $(KERNEL)

initramfs: kernel ## build/initramfs.cpio with tether-agent as /init
	@mkdir -p $(BUILD)
	go build -trimpath -buildvcs=false -tags grpcnotrace,$(TAGS) -ldflags='-s -w' -o $(BUILD)/tether-agent ./cmd/tether-agent
	initramfs/build.sh $(BUILD)/tether-agent $(KERNEL) $(BUILD)/initramfs.cpio $(if $(SIGNERS),-signers=$(shell echo $(SIGNERS) | tr ' ' ','))

modules: ## The example root module (erofs) into build/modules
	examples/build.sh $(BUILD)/modules

run: ## Init a data dir under .tether/, serve, push the example (ROOT=debian: a stock Debian root), boot one QEMU node
	ROOT=$(ROOT) scripts/run.sh

screenshots: ## Regenerate the dashboard screenshots in docs/screenshots (needs chromium)
	TETHER_SCREENSHOTS=$(CURDIR)/docs/screenshots go test -count=1 -run TestBrowserFleetAndPools -v ./internal/tetherctl/dashboard/

clean:
	rm -rf $(BIN) $(BUILD)
