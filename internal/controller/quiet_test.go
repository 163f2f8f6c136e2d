package controller

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/progress"
)

// bookmarkCounter records each of the operator's watch streams: its resource (the last segment
// of its path), whether it resumed from a resourceVersion, when it started and ended, and when
// it received a bookmark. A watch event's type is the string BOOKMARK in JSON and protobuf alike.
type bookmarkCounter struct {
	next http.RoundTripper

	mu      sync.Mutex
	streams []*watchStream
}

type watchStream struct {
	resource   string
	resumed    bool // from a resourceVersion; else a watch-list that begins with the objects
	start, end time.Time
	bookmarks  []time.Time
}

func (b *bookmarkCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || req.URL.Query().Get("watch") != "true" {
		return resp, err
	}
	s := &watchStream{resource: req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:], resumed: req.URL.Query().Get("resourceVersion") != "", start: time.Now()}
	b.mu.Lock()
	b.streams = append(b.streams, s)
	b.mu.Unlock()
	resp.Body = &bookmarkScanner{ReadCloser: resp.Body,
		seen: func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			s.bookmarks = append(s.bookmarks, time.Now())
		},
		ended: func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if s.end.IsZero() {
				s.end = time.Now()
			}
		}}
	return resp, nil
}

// snapshot copies the streams, the open ones ending at now.
func (b *bookmarkCounter) snapshot(now time.Time) []watchStream {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]watchStream, len(b.streams))
	for i, s := range b.streams {
		out[i] = *s
		out[i].bookmarks = slices.Clone(s.bookmarks)
		if out[i].end.IsZero() {
			out[i].end = now
		}
	}
	return out
}

// bookmarkScanner calls seen for every BOOKMARK in the stream, one split across reads included,
// and ended when the stream ends.
type bookmarkScanner struct {
	io.ReadCloser
	tail  []byte
	seen  func()
	ended func()
}

var bookmarkType = []byte("BOOKMARK")

func (s *bookmarkScanner) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if n > 0 {
		data := append(s.tail, p[:n]...)
		for i := bytes.Index(data, bookmarkType); i >= 0; i = bytes.Index(data, bookmarkType) {
			s.seen()
			data = data[i+len(bookmarkType):]
		}
		s.tail = slices.Clone(data[max(0, len(data)-len(bookmarkType)+1):])
	}
	if err != nil {
		s.ended()
	}
	return n, err
}

func (s *bookmarkScanner) Close() error {
	s.ended()
	return s.ReadCloser.Close()
}

// The other informer tests keep every informer busy; a real cluster can be quiet. Here nothing
// changes for longer than the production limits allow an informer to go without data plus the
// cut of a silent watch (progress.DefaultConfig: 3 min and 90 s): the informers stay current on
// the API server's bookmarks alone, so the ServiceEntry stays as it was and the heartbeat goes on.
// The premise of those limits is checked too (below): kube-apiserver sends a quiet watch a
// bookmark each minute, once the watch has resumed from a resourceVersion.
func TestInformers_AQuietClusterIsNotTakenForABlindOne(t *testing.T) {
	limits := progress.DefaultConfig()
	c := newIsolatedClusterWith(t, isolatedOptions{quiet: true, limits: &limits})
	c.mirroredService("10.53.0.1", "10.53.0.2")
	c.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	se, err := c.serviceEntry("web")
	if err != nil {
		t.Fatal(err)
	}

	quiet := limits.BlindAfter + limits.SilenceLimit + 30*time.Second
	start := time.Now()
	time.Sleep(quiet) // the test: nothing happens
	end := time.Now()

	if blind := c.tracker.Blind(); len(blind) > 0 {
		t.Errorf("a quiet informer is taken for a blind one: %s", describeBlindness(blind))
	}
	now, err := c.serviceEntry("web")
	if err != nil || now.UID != se.UID || now.ResourceVersion != se.ResourceVersion {
		t.Errorf("the ServiceEntry changed or went during the quiet (err %v): a quiet cluster is no fault", err)
	}
	c.waitForCondition("web", adlbv1.ConditionReady, metav1.ConditionTrue, adlbv1.ReasonMirrored)
	if renewed := c.heartbeatRenewed(); renewed.Before(end.Add(-10 * time.Second)) {
		t.Errorf("the heartbeat was last renewed at %v, before the quiet ended at %v", renewed, end)
	}

	// The premises of those limits, as kube-apiserver keeps them:
	// - a watch resumed from a resourceVersion gets a bookmark each minute, also when nothing of
	//   its resource changes;
	// - a watch-list (the informer's first watch, which begins with the objects) of a resource
	//   nobody changes gets none after its first: the tracker cuts it once silent, and the
	//   informer resumes from a resourceVersion.
	// So no informer goes without data for longer than the silence limit, a tick of the cut
	// and a bookmark period: well within the blindness limit.
	const period, slack = time.Minute, 15 * time.Second
	streams := c.bookmarks.snapshot(end)
	for _, s := range streams {
		if s.end.Before(start) {
			continue
		}
		if s.resumed {
			for i, from := 0, s.start; i <= len(s.bookmarks); i++ {
				to := s.end
				if i < len(s.bookmarks) {
					to = s.bookmarks[i]
				}
				if gap := to.Sub(from); gap > period+slack {
					t.Errorf("a %s watch resumed at %s went %v without a bookmark: kube-apiserver no longer sends a resumed watch one each minute, and the tracker's limits (%v silence, %v blind) rest on it",
						s.resource, s.start.Format(time.TimeOnly), gap.Round(time.Second), limits.SilenceLimit, limits.BlindAfter)
				}
				from = to
			}
		}
	}
	bound := limits.SilenceLimit + limits.SilenceLimit/10 + period + slack
	for _, resource := range []string{"adaptiveloadbalancers", "services", "endpointslices", "pods", "nodes", "serviceentries", "namespaces", "configmaps", "deployments"} {
		times := []time.Time{start}
		for _, s := range streams {
			if s.resource == resource {
				for _, b := range s.bookmarks {
					if b.After(start) {
						times = append(times, b)
					}
				}
			}
		}
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		times = append(times, end)
		longest := time.Duration(0)
		for i := 1; i < len(times); i++ {
			longest = max(longest, times[i].Sub(times[i-1]))
		}
		if longest > bound {
			t.Errorf("the %s informer went %v without data, more than the silence limit, a tick and a bookmark period (%v)", resource, longest.Round(time.Second), bound)
		}
		t.Logf("%s: %d bookmarks during the quiet, longest gap %v", resource, len(times)-2, longest.Round(time.Second))
	}
}
