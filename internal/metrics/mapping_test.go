package metrics

import (
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

func sample(ns, pod string, v float64) *model.Sample {
	return &model.Sample{Metric: model.Metric{"namespace": model.LabelValue(ns), "pod": model.LabelValue(pod)}, Value: model.SampleValue(v)}
}

func TestSplitByPod(t *testing.T) {
	vec := model.Vector{
		sample("shop", "a", 1.5),
		sample("shop", "b", 2),
		{Metric: model.Metric{"namespace": "shop", "pod": "b", "instance": "second-scrape"}, Value: 3},
		sample("pay", "a", math.NaN()),
		sample("pay", "inf", math.Inf(1)),
		{Metric: model.Metric{"job": "no-pod-labels"}, Value: 9},
	}
	got := splitByPod(vec, DefaultLabels)

	t.Run("a single series maps to its pod", func(t *testing.T) {
		s := got.sampleOf(podKey{"shop", "a"})
		if !s.Present || s.Value != 1.5 || s.Err != nil {
			t.Errorf("got %+v", s)
		}
	})
	t.Run("two series for one pod are never summed: the pod fails with a duplicate error", func(t *testing.T) {
		s := got.sampleOf(podKey{"shop", "b"})
		var dup *DuplicateSeriesError
		if s.Present || !errors.As(s.Err, &dup) || len(dup.Series) != 2 {
			t.Errorf("got %+v", s)
		}
	})
	t.Run("NaN and Inf mark the pod not present", func(t *testing.T) {
		for _, pod := range []podKey{{"pay", "a"}, {"pay", "inf"}} {
			if s := got.sampleOf(pod); s.Present || !errors.Is(s.Err, ErrNonFinite) {
				t.Errorf("%v: got %+v", pod, s)
			}
		}
	})
	t.Run("a pod missing from the result has no data", func(t *testing.T) {
		if s := got.sampleOf(podKey{"shop", "zzz"}); s.Present || !errors.Is(s.Err, ErrNoData) {
			t.Errorf("got %+v", s)
		}
	})
	t.Run("series without pod labels are counted", func(t *testing.T) {
		if got.unlabelled != 1 {
			t.Errorf("unlabelled = %d", got.unlabelled)
		}
	})
}

func TestApplyFreshness(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	interval := 10 * time.Second
	key := podKey{"shop", "a"}
	index, _ := newPodIndex([]Pod{{Namespace: key.namespace, Name: key.name}})
	probe := func(age time.Duration) *podValues {
		ts := now.Add(-age)
		p := newPodValues(index, DefaultLabels)
		p.add(key.namespace, key.name, float64(ts.UnixMilli())/1000, nil)
		return &p
	}
	present := Sample{Value: 1, Present: true}
	cases := map[string]struct {
		probe     *podValues
		probeErr  error
		wantFresh bool
		wantErr   error
	}{
		"a sample 20s old at a 10s interval is still fresh (boundary)": {probe(20 * time.Second), nil, true, nil},
		"a sample 20.001s old is stale":                                {probe(20*time.Second + time.Millisecond), nil, false, ErrStale},
		"a pod missing from the probe is stale":                        {ptr(newPodValues(index, DefaultLabels)), nil, false, ErrStale},
		"a failed probe leaves freshness unknown":                      {ptr(newPodValues(index, DefaultLabels)), ErrTimeout, false, ErrTimeout},
		"without a probe the value counts as fresh at now":             {nil, nil, true, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := applyFreshness(present, 0, key, tc.probe, tc.probeErr, now, interval)
			if got.Fresh != tc.wantFresh || !got.Present {
				t.Errorf("got %+v", got)
			}
			if tc.wantErr == nil && got.Err != nil || tc.wantErr != nil && !errors.Is(got.Err, tc.wantErr) {
				t.Errorf("err %v, want %v", got.Err, tc.wantErr)
			}
			if tc.wantFresh && got.Usable() != true {
				t.Error("fresh present sample must be usable")
			}
		})
	}
	t.Run("the timestamp is the probe's sample time", func(t *testing.T) {
		got := applyFreshness(present, 0, key, probe(5*time.Second), nil, now, interval)
		if !got.Timestamp.Equal(now.Add(-5 * time.Second)) {
			t.Errorf("timestamp %v", got.Timestamp)
		}
	})
	t.Run("an absent sample stays absent", func(t *testing.T) {
		got := applyFreshness(Sample{Err: ErrNoData}, 0, key, probe(0), nil, now, interval)
		if got.Present || got.Fresh {
			t.Errorf("got %+v", got)
		}
	})
}

func TestParseRetryAfter(t *testing.T) {
	cases := map[string]struct {
		header http.Header
		want   time.Duration
	}{
		"delay seconds":                {http.Header{"Retry-After": {"12"}}, 12 * time.Second},
		"http date relative to Date":   {http.Header{"Retry-After": {"Sun, 22 Nov 2026 12:01:00 GMT"}, "Date": {"Sun, 22 Nov 2026 12:00:00 GMT"}}, time.Minute},
		"absent":                       {http.Header{}, 0},
		"garbage is ignored, not used": {http.Header{"Retry-After": {"soon"}}, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := parseRetryAfter(tc.header); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// splitByPod indexes a model.Vector by the pod labels through podValues.add, the same path the
// streaming decoder feeds, so mapping rules can be tested without JSON.
func splitByPod(vec model.Vector, labels Labels) podValues {
	out := newPodValues(newOpenPodIndex(), labels)
	for _, s := range vec {
		var others model.Metric
		for name, v := range s.Metric {
			if string(name) != labels.Namespace && string(name) != labels.Pod {
				if others == nil {
					others = model.Metric{}
				}
				others[name] = v
			}
		}
		out.add(string(s.Metric[model.LabelName(labels.Namespace)]), string(s.Metric[model.LabelName(labels.Pod)]), float64(s.Value), others)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// sampleOf is valueSample by pod name, for tests.
func (p *podValues) sampleOf(key podKey) Sample {
	slot, ok := p.index.slots[key.namespace][key.name]
	if !ok {
		slot = int32(len(p.state)) // outside every result: no data
	}
	return p.valueSample(slot, key)
}
