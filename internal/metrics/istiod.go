package metrics

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// DefaultRemoteClustersQuery reads istiod's own gauge of the clusters it manages: each istiod pod
// in istiod's namespace ({{.Namespaces}}) with the number of remote clusters it reads (0 in a mesh
// of one cluster; istiod records it when its multi-cluster controller starts, and again each
// time a remote cluster is added or removed). It carries no credentials: the operator needs no
// access to istiod's remote secrets to know whether there are any. On a TSDB that holds several
// clusters' series, replace it with one that selects this cluster's (add its cluster label).
const DefaultRemoteClustersQuery = `max by ({{.Labels.Namespace}}, {{.Labels.Pod}}) (istiod_managed_clusters{cluster_type="remote", {{.Labels.Namespace}}=~"{{.Namespaces}}"})`

// RemoteClusterCount is one reading of istiod's count of the remote clusters it manages.
type RemoteClusterCount struct {
	// Query is the PromQL sent.
	Query string
	// ByIstiod is each istiod pod's count, by "namespace/pod"; never empty in a reading
	// returned without an error.
	ByIstiod map[string]float64
}

// Istiods lists the istiod pods of the reading, sorted.
func (c RemoteClusterCount) Istiods() []string {
	out := make([]string, 0, len(c.ByIstiod))
	for pod := range c.ByIstiod {
		out = append(out, pod)
	}
	sort.Strings(out)
	return out
}

// RemoteClusterCounter is the ability of a Source to read istiod's count of its remote clusters
// (a mesh of several clusters, which the operator refuses) from the TSDB.
type RemoteClusterCounter interface {
	// RemoteClusters reads the count of every istiod pod in istioNamespace at the time at.
	// Without a series for any istiod it returns an error matching ErrNoData: the TSDB does not
	// scrape istiod, and cannot say.
	RemoteClusters(ctx context.Context, at time.Time, istioNamespace string) (RemoteClusterCount, error)
}

var _ RemoteClusterCounter = (*prometheusSource)(nil)

// RemoteClusters implements RemoteClusterCounter.
func (s *prometheusSource) RemoteClusters(ctx context.Context, at time.Time, istioNamespace string) (RemoteClusterCount, error) {
	text, err := s.render(remoteClustersQueryName, s.remoteClusters, NewTemplateData([]string{istioNamespace}, "", time.Minute, s.labels))
	if err != nil {
		return RemoteClusterCount{}, err
	}
	out := RemoteClusterCount{Query: text}
	index := newOpenPodIndex()
	start := time.Now()
	decoded, _, err := s.query(ctx, text, at, index, false)
	s.metrics.duration.WithLabelValues(remoteClustersQueryName).Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.errors.WithLabelValues(remoteClustersQueryName, Reason(err)).Inc()
		return out, &QueryError{Name: remoteClustersQueryName, Query: text, Err: err}
	}
	out.ByIstiod = map[string]float64{}
	var errs []error
	for slot, key := range index.keys {
		sample := decoded.result.valueSample(int32(slot), key)
		if sample.Err != nil {
			errs = append(errs, sample.Err)
			continue
		}
		out.ByIstiod[key.namespace+"/"+key.name] = sample.Value
	}
	if len(out.ByIstiod) == 0 {
		// Series there were, but none usable (without the pod labels, duplicated, not finite).
		errs = append(errs, &NoDataError{})
		err := &QueryError{Name: remoteClustersQueryName, Query: text, Err: errors.Join(errs...)}
		s.metrics.errors.WithLabelValues(remoteClustersQueryName, Reason(err)).Inc()
		return out, err
	}
	if len(errs) > 0 {
		// An istiod whose count cannot be read might be the one that reads other clusters.
		err := &QueryError{Name: remoteClustersQueryName, Query: text, Err: fmt.Errorf("%d istiod series unusable: %w", len(errs), errors.Join(errs...))}
		s.metrics.errors.WithLabelValues(remoteClustersQueryName, Reason(err)).Inc()
		return out, err
	}
	return out, nil
}

// remoteClustersQueryName names the query in errors and in the source's own metrics.
const remoteClustersQueryName = "remoteClusters"
