package istio

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	apinetworkingv1 "istio.io/api/networking/v1"
)

// MaxWeightSum is the largest sum of endpoint weights Envoy accepts in one locality (a uint32).
// Above it Envoy rejects the whole cluster update, and istiod sums the endpoint weights of a
// locality into the locality's own weight, which overflows the same way.
const MaxWeightSum = math.MaxUint32

// LimitWeightSum scales every weight down in the same proportion when the sum of all of them
// exceeds MaxWeightSum, so that no locality can exceed it either; ratios between endpoints are
// kept up to rounding, and no weight drops below 1 (Envoy ignores weight 0). It reports whether
// it changed anything. At the operator's largest weight (1,000,000) the sum passes MaxWeightSum
// from 4,295 endpoints.
func LimitWeightSum(entries []*apinetworkingv1.WorkloadEntry) bool {
	var total uint64
	for _, e := range entries {
		total += uint64(e.Weight)
	}
	if total <= MaxWeightSum {
		return false
	}
	// Rounding each weight up to 1 can add at most one per endpoint: keep that much room.
	budget := uint64(MaxWeightSum) - uint64(len(entries))
	for _, e := range entries {
		scaled := uint64(e.Weight) * budget / total
		e.Weight = uint32(max(scaled, 1))
	}
	return true
}

// MaxEndpoints is the most endpoints one Service may have mirrored, across all its slices
// (slices.go). A slice holds at most MaxSliceEndpoints, so the bound is not etcd's object size
// but what one Service costs the operator: the weight cycle reads and plans every endpoint, and
// a weight write rewrites up to MaxEndpoints/MaxSliceEndpoints objects (200). It also keeps the
// sum of weights of a Service bounded: LimitWeightSum scales them over the whole Service. A
// Service with more endpoints is not mirrored: its clients use the Kubernetes endpoints,
// unweighted.
const MaxEndpoints = 20_000

// MaxSingleServiceEntryEndpoints is the most endpoints one ServiceEntry could carry before
// slices: etcd refuses an object above 1.5 MiB (its --max-request-bytes), and a pod with
// ordinary labels (eleven of them, as a Helm-installed Deployment in the mesh has, two ports, a
// locality and a service account) costs 534 bytes of stored ServiceEntry, so etcd refuses from
// about 2,900 endpoints. Measured by TestServiceEntrySize_EtcdRefusesAboveTheLimit against a
// real API server; see docs/operations.md. MaxSliceEndpoints is well below it.
const MaxSingleServiceEntryEndpoints = 2500

// MaxEncodedBytes bounds the ServiceEntry spec's JSON size whatever the endpoint count, for pods
// with unusually many or long labels; etcd's limit, 1,572,864 bytes, leaves room beside it for
// the object's metadata.
const MaxEncodedBytes = 1_400_000

// ErrTooLarge marks a ServiceEntry too large for etcd, or for the operator's limits.
var ErrTooLarge = errors.New("ServiceEntry too large")

// checkCount refuses a Service with more than maxEndpoints endpoints (0: MaxEndpoints).
func checkCount(spec *apinetworkingv1.ServiceEntry, maxEndpoints int) error {
	if maxEndpoints <= 0 {
		maxEndpoints = MaxEndpoints
	}
	if n := len(spec.Endpoints); n > maxEndpoints {
		return fmt.Errorf("%w: %d ready endpoints, above the limit of %d endpoints per Service; its clients use the Kubernetes endpoints without weights", ErrTooLarge, n, maxEndpoints)
	}
	return nil
}

// CheckSliceSize refuses one slice whose spec and the reserved bytes stored beside it (the
// operator's annotations) exceed MaxEncodedBytes: at MaxSliceEndpoints endpoints only labels
// some twenty-five times longer than usual can (14 KB per endpoint).
func CheckSliceSize(spec *apinetworkingv1.ServiceEntry, reserved int) error {
	raw, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode ServiceEntry: %w", err)
	}
	if len(raw)+reserved > MaxEncodedBytes {
		return fmt.Errorf("%w: the endpoints' labels make one slice of %d endpoints %d bytes, above the limit of %d that keeps it within etcd's 1.5 MiB object size; shorten the pods' labels. Its clients use the Kubernetes endpoints without weights", ErrTooLarge, len(spec.Endpoints), len(raw)+reserved, MaxEncodedBytes)
	}
	return nil
}
