# adaptive-lb Makefile. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

GO ?= go
BIN_DIR ?= $(CURDIR)/bin
# Real components the tests start on loopback (kube-apiserver, etcd, kube-controller-manager,
# VictoriaMetrics) are built from the Go module proxy once and cached here. Override to share one
# cache between checkouts.
TOOLS_DIR ?= $(CURDIR)/.cache/tools
export TOOLS_DIR

# envtest reads KUBEBUILDER_ASSETS; our VictoriaMetrics tests read ADAPTIVELB_VMSINGLE_BIN.
KUBEBUILDER_ASSETS ?= $(TOOLS_DIR)/k8s
ADAPTIVELB_KUBE_CONTROLLER_MANAGER_BIN ?= $(TOOLS_DIR)/k8s/kube-controller-manager
ADAPTIVELB_VMSINGLE_BIN ?= $(TOOLS_DIR)/victoria-metrics/victoria-metrics
ADAPTIVELB_HELM_BIN ?= $(TOOLS_DIR)/helm/helm
ADAPTIVELB_KUSTOMIZE_BIN ?= $(TOOLS_DIR)/kustomize/kustomize
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
test-istiod: istiod-module ## Run the differential tests against istiod's own xDS generation (module test/istiod).
	cd test/istiod && $(GO) vet ./... && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

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
	$(GO) run ./cmd/adaptive-lb simulate

##@ Test components

.PHONY: test-assets
test-assets: envtest-assets victoriametrics helm kustomize istiod-module ## Build the real components the tests run against.

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd and kube-controller-manager for the integration tests into $(TOOLS_DIR)/k8s.
	hack/build-envtest-assets.sh "$(TOOLS_DIR)/k8s"

.PHONY: istiod-module
istiod-module: ## Prepare the patched istio.io/istio copy the istiod tests compile into $(TOOLS_DIR)/istio.
	hack/build-istiod-module.sh "$(TOOLS_DIR)/istio"

.PHONY: helm
helm: ## Build the helm CLI for the chart tests into $(TOOLS_DIR)/helm.
	hack/build-helm.sh "$(TOOLS_DIR)/helm"

.PHONY: kustomize
kustomize: ## Build the kustomize CLI for the install tests into $(TOOLS_DIR)/kustomize.
	hack/build-kustomize.sh "$(TOOLS_DIR)/kustomize"

.PHONY: victoriametrics
victoriametrics: ## Build VictoriaMetrics single-node into $(TOOLS_DIR)/victoria-metrics.
	hack/build-victoriametrics.sh "$(TOOLS_DIR)/victoria-metrics"

##@ Code generation

CONTROLLER_GEN ?= $(TOOLS_DIR)/controller-gen

.PHONY: controller-gen
controller-gen: ## Build controller-gen from hack/tools into $(TOOLS_DIR).
	@test -x "$(CONTROLLER_GEN)" || (cd hack/tools && GOFLAGS=-mod=mod $(GO) build -o "$(CONTROLLER_GEN)" sigs.k8s.io/controller-tools/cmd/controller-gen)

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
