package controller

import (
	"context"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// observationKey identifies one fetched observation: the same pod under two Services with
// different queries is observed twice, once per set of queries.
type observationKey struct {
	queries metrics.QueryTemplates
	pod     types.NamespacedName
}

// fetchResult is one batched fetch, shared by every target with the same interval.
type fetchResult struct {
	observations map[observationKey]metrics.Observation
	err          error
}

// fetch sends one batched request per distinct interval (normally one): its queries cover every
// due Service's pods, whatever their number.
func (w *WeightCycle) fetch(ctx context.Context, now time.Time, due []*dueTarget) map[time.Duration]fetchResult {
	byInterval := map[time.Duration][]metrics.Pod{}
	requested := map[time.Duration]map[observationKey]bool{}
	for _, d := range due {
		if requested[d.interval] == nil {
			requested[d.interval] = map[observationKey]bool{}
		}
		for _, ip := range d.podOrder {
			pod, ok := d.pods[ip]
			if !ok {
				continue
			}
			k := observationKey{queries: d.queries, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
			if requested[d.interval][k] {
				continue
			}
			requested[d.interval][k] = true
			byInterval[d.interval] = append(byInterval[d.interval], metrics.Pod{Namespace: pod.Namespace, Name: pod.Name, IP: ip, CPULimitCores: cpuLimit(pod), Queries: d.queries})
		}
	}
	out := map[time.Duration]fetchResult{}
	for interval, pods := range byInterval {
		res := fetchResult{observations: map[observationKey]metrics.Observation{}}
		batch, err := w.Source.Fetch(ctx, metrics.Request{Pods: pods, Now: now, Window: 2 * interval, Interval: interval})
		res.err = err
		// The source returns one observation per request entry, each under the entry's queries.
		for _, o := range batch.Observations {
			res.observations[observationKey{queries: o.Queries, pod: types.NamespacedName{Namespace: o.Namespace, Name: o.Name}}] = o
		}
		out[interval] = res
	}
	return out
}

// latencyBuckets hands a pod's fetched latency histogram to the engine; nil when there is none.
func latencyBuckets(fetched []metrics.LatencyBucket) []weights.LatencyBucket {
	if len(fetched) == 0 {
		return nil
	}
	out := make([]weights.LatencyBucket, len(fetched))
	for i, b := range fetched {
		out[i] = weights.LatencyBucket{UpperBoundSeconds: b.UpperBoundSeconds, Count: b.Count}
	}
	return out
}

// cpuLimit sums the CPU limits of the application containers; the sidecar's CPU is not in the
// cAdvisor query either.
func cpuLimit(pod *corev1.Pod) float64 {
	if v, ok := pod.Annotations[CachedCPULimitAnnotation]; ok { // a cached pod: derived already
		if m, err := strconv.ParseInt(v, 10, 64); err == nil {
			return float64(m) / 1000
		}
	}
	total := 0.0
	for _, c := range pod.Spec.Containers {
		if c.Name == "istio-proxy" {
			continue
		}
		l, ok := c.Resources.Limits[corev1.ResourceCPU]
		if !ok {
			return 0 // one unlimited container makes the pod unlimited
		}
		total += l.AsApproximateFloat64()
	}
	return total
}
