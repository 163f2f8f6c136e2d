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
// due Service's pods, whatever their number. Each batch reads a window of two intervals.
func (w *WeightCycle) fetch(ctx context.Context, now time.Time, due []*dueTarget) map[time.Duration]fetchResult {
	byInterval := map[time.Duration][]*dueTarget{}
	for _, d := range due {
		byInterval[d.interval] = append(byInterval[d.interval], d)
	}
	out := map[time.Duration]fetchResult{}
	for interval, group := range byInterval {
		out[interval] = w.fetchBatch(ctx, now, group, 2*interval, interval)
	}
	return out
}

// fetchBatch sends one batched request for every pod of targets, their rates over window; a
// sample older than twice staleAfter is stale.
func (w *WeightCycle) fetchBatch(ctx context.Context, now time.Time, targets []*dueTarget, window, staleAfter time.Duration) fetchResult {
	var pods []metrics.Pod
	requested := map[observationKey]bool{}
	for _, d := range targets {
		for _, ip := range d.podOrder {
			pod, ok := d.pods[ip]
			if !ok {
				continue
			}
			k := observationKey{queries: d.queries, pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}}
			if requested[k] {
				continue
			}
			requested[k] = true
			pods = append(pods, metrics.Pod{Namespace: pod.Namespace, Name: pod.Name, IP: ip, CPULimitCores: cpuLimit(pod), Queries: d.queries})
		}
	}
	res := fetchResult{observations: map[observationKey]metrics.Observation{}}
	if len(pods) == 0 {
		return res
	}
	batch, err := w.Source.Fetch(ctx, metrics.Request{Pods: pods, Now: now, Window: window, Interval: staleAfter})
	res.err = err
	// The source returns one observation per request entry, each under the entry's queries.
	for _, o := range batch.Observations {
		res.observations[observationKey{queries: o.Queries, pod: types.NamespacedName{Namespace: o.Namespace, Name: o.Name}}] = o
	}
	return res
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
