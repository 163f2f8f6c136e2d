# adaptive-lb Makefile. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

GO ?= go
BIN_DIR ?= $(CURDIR)/bin
# Real components the tests start on loopback (kube-apiserver, etcd, kube-controller-manager,
# VictoriaMetrics) and the tools they run (helm, kustomize, the patched istio.io/istio copy,
# controller-gen) are built from the Go module proxy once per user and version, in the user cache
# directory, outside any checkout (as setup-envtest keeps its binaries), so a second clone reuses
# them: each in TOOLS_DIR/NAME/VERSION-HASH (hack/toolcache.sh), so a changed pin rebuilds only
# that component. Override TOOLS_DIR to keep them elsewhere.
ifneq ($(XDG_CACHE_HOME),)
USER_CACHE_DIR := $(XDG_CACHE_HOME)
else ifeq ($(shell uname -s),Darwin)
USER_CACHE_DIR := $(HOME)/Library/Caches
else
USER_CACHE_DIR := $(HOME)/.cache
endif
TOOLS_DIR ?= $(USER_CACHE_DIR)/adaptive-lb/tools
export TOOLS_DIR

# The folder of each component at its pinned version, computed once per make run.
tool_dir = $(shell TOOLS_DIR='$(TOOLS_DIR)' $(CURDIR)/hack/toolcache.sh dir $(1))
ENVTEST_DIR := $(call tool_dir,envtest)
KUBE_CONTROLLER_MANAGER_DIR := $(call tool_dir,kube-controller-manager)
VICTORIA_METRICS_DIR := $(call tool_dir,victoria-metrics)
HELM_DIR := $(call tool_dir,helm)
KUSTOMIZE_DIR := $(call tool_dir,kustomize)
CONTROLLER_GEN_DIR := $(call tool_dir,controller-gen)

# envtest reads KUBEBUILDER_ASSETS; our tests read the ADAPTIVELB_*_BIN variables.
KUBEBUILDER_ASSETS ?= $(ENVTEST_DIR)
ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN ?= $(KUBE_CONTROLLER_MANAGER_DIR)/kube-controller-manager
ADAPTIVELB_VMSINGLE_BIN ?= $(VICTORIA_METRICS_DIR)/victoria-metrics
ADAPTIVELB_HELM_BIN ?= $(HELM_DIR)/helm
ADAPTIVELB_KUSTOMIZE_BIN ?= $(KUSTOMIZE_DIR)/kustomize
export KUBEBUILDER_ASSETS ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN ADAPTIVELB_VMSINGLE_BIN ADAPTIVELB_HELM_BIN ADAPTIVELB_KUSTOMIZE_BIN

# Generous: the envtest suites start real API servers on a 2-core machine.
TEST_TIMEOUT ?= 40m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-22s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: fmt
fmt: ## Run gofmt on the module.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: test
test: test-assets vet verify-generated ## Run every test, building the real test components on first use.
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) test-istiod

.PHONY: test-istiod
# -trimpath keys the compiled istio.io/istio copy in the Go build cache by its module and content,
# not by the checkout's path to it, so a second clone reuses it instead of compiling it again.
test-istiod: istiod-module ## Run the differential tests against istiod's own xDS generation (module test/istiod).
	cd test/istiod && $(GO) vet -trimpath ./... && $(GO) test -trimpath -count=1 -timeout $(TEST_TIMEOUT) ./...

.PHONY: test-unit
test-unit: ## Run the tests that need no real components (fast loop).
	$(GO) test -short ./...

.PHONY: bench
bench: ## Run the Go benchmarks (results are recorded in docs/benchmarks.md).
	$(GO) test -run '^$$' -bench . -benchmem ./...

##@ Build

.PHONY: build
build: ## Build bin/adaptive-lb.
	$(GO) build -o $(BIN_DIR)/adaptive-lb ./cmd/adaptive-lb

.PHONY: simulate
simulate: ## Run the simulator on its built-in seed-fib scenario.
	$(GO) run ./cmd/simulate

##@ Test components

.PHONY: test-assets
test-assets: envtest-assets victoriametrics helm kustomize istiod-module ## Build the real components the tests run against.

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kube-controller-manager for the integration tests into $(TOOLS_DIR).
	hack/build-envtest-assets.sh

.PHONY: istiod-module
istiod-module: ## Prepare the patched istio.io/istio copy the istiod tests compile into $(TOOLS_DIR)/istio.
	hack/build-istiod-module.sh

.PHONY: helm
helm: ## Build the helm CLI for the chart tests into $(TOOLS_DIR)/helm.
	hack/build-helm.sh

.PHONY: kustomize
kustomize: ## Build the kustomize CLI for the install tests into $(TOOLS_DIR)/kustomize.
	hack/build-kustomize.sh

.PHONY: victoriametrics
victoriametrics: ## Build VictoriaMetrics single-node into $(TOOLS_DIR)/victoria-metrics.
	hack/build-victoriametrics.sh

.PHONY: test-env
test-env: ## Print the exports that point go test at the cached components: eval "$$(make -s test-env)".
	@echo "export TOOLS_DIR='$(TOOLS_DIR)'"
	@echo "export KUBEBUILDER_ASSETS='$(KUBEBUILDER_ASSETS)'"
	@echo "export ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN='$(ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN)'"
	@echo "export ADAPTIVELB_VMSINGLE_BIN='$(ADAPTIVELB_VMSINGLE_BIN)'"
	@echo "export ADAPTIVELB_HELM_BIN='$(ADAPTIVELB_HELM_BIN)'"
	@echo "export ADAPTIVELB_KUSTOMIZE_BIN='$(ADAPTIVELB_KUSTOMIZE_BIN)'"

##@ Code generation

CONTROLLER_GEN ?= $(CONTROLLER_GEN_DIR)/controller-gen

.PHONY: controller-gen
controller-gen: ## Build controller-gen from hack/tools into $(TOOLS_DIR)/controller-gen.
	@hack/build-controller-gen.sh

.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests into config/ and the Helm chart.
	"$(CONTROLLER_GEN)" rbac:roleName=adaptive-lb crd paths="./api/..." paths="./internal/controller/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	cp config/crd/bases/adaptivelb.io_adaptiveloadbalancers.yaml charts/adaptive-lb/crds/
	awk '/^---/{doc++} doc==1 && seen{print} doc==1 && /^rules:/{seen=1}' config/rbac/role.yaml > charts/adaptive-lb/files/role-rules.yaml
	awk '/^---/{doc++; seen=0} doc==2 && seen{print} doc==2 && /^rules:/{seen=1}' config/rbac/role.yaml > charts/adaptive-lb/files/istio-role-rules.yaml
	cp charts/adaptive-lb/files/alerts.yaml config/prometheus/alerts.yaml

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods for the API types.
	"$(CONTROLLER_GEN)" object paths="./api/..."

.PHONY: verify-generated
verify-generated: controller-gen ## Fail when the committed CRD, RBAC or DeepCopy code differs from the markers.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	"$(CONTROLLER_GEN)" rbac:roleName=adaptive-lb crd paths="./api/..." paths="./internal/controller/..." output:crd:artifacts:config=$$tmp/crd output:rbac:artifacts:config=$$tmp/rbac; \
	diff -ru config/crd/bases $$tmp/crd && diff -ru config/rbac/role.yaml $$tmp/rbac/role.yaml || { echo "generated manifests are stale: run make manifests"; exit 1; }; \
	cp api/v1alpha1/zz_generated.deepcopy.go $$tmp/deepcopy.go; "$(CONTROLLER_GEN)" object paths="./api/..."; \
	if ! diff -q $$tmp/deepcopy.go api/v1alpha1/zz_generated.deepcopy.go >/dev/null; then cp $$tmp/deepcopy.go api/v1alpha1/zz_generated.deepcopy.go; echo "DeepCopy code is stale: run make generate"; exit 1; fi
