// Package progress tells whether the operator's informers still see the cluster. Once an
// informer has synced, reads from its cache succeed whatever happens to its list and watch: a
// verb removed from the operator's Role, or a watch that stays open and delivers nothing, leave
// it serving the last state it saw, and nothing says so. The Tracker sits in the informers'
// HTTP transport and records, per informer (per resource and namespace), when it last made
// progress: a list that completed, or any data (an event or a bookmark) on a watch. A failed list
// or watch, or silence longer than the API server's bookmark period allows, makes it blind.
//
// It also cuts a list or watch that has delivered nothing for SilenceLimit: a cut watch ends as if
// the API server had closed it, so the informer watches again from where it stopped, which
// repairs a single wedged stream; a cut list fails, so the informer lists again. The API server
// sends every watch a bookmark each minute, so a healthy watch is never that silent, and a watch
// that wedges again makes no progress: its informer turns blind after BlindAfter.
package progress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Config sets how long an informer may go without progress.
type Config struct {
	// SilenceLimit is how long a list or watch may deliver nothing before it is cut.
	SilenceLimit time.Duration
	// BlindAfter is how long an informer may make no progress, without any failed request,
	// before it counts as blind: longer than SilenceLimit plus the API server's bookmark period,
	// so that a watch started after a cut has had its first bookmark.
	BlindAfter time.Duration
	// ErrorGrace is how long a failed list or watch may go unrepaired (the informer retries
	// with back-off) before its informer counts as blind.
	ErrorGrace time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Describe says what a failed list or watch answered, from its status and body (at most
	// 64 KiB); nil reads a JSON Status's message. The API server answers informers that ask for
	// protobuf in protobuf, which a caller with its codecs can decode.
	Describe func(status int, contentType string, body []byte) string
}

// DefaultConfig: kube-apiserver sends a watch resumed from a resourceVersion a bookmark each
// minute, also when nothing of its resource changes, so 90 s of silence there means a wedged
// stream. The informer's first watch, a watch-list that begins with the objects, gets no further
// bookmark while nothing of its resource changes (TestInformers_AQuietClusterIsNotTakenForABlindOne
// found it on a quiet cluster): it is cut after 90 s too, and the watch that resumes from its
// resourceVersion has its first bookmark within a minute. So at most 90 s, a tick of the cut and a
// minute pass without data, and 3 min without progress means the informer no longer gets data; a
// failure not repaired by the informer's first retries (0.8 s, 1.6 s, 3.2 s) within 5 s is more
// than a blip.
func DefaultConfig() Config {
	return Config{SilenceLimit: 90 * time.Second, BlindAfter: 3 * time.Minute, ErrorGrace: 5 * time.Second}
}

// Tracker records the progress of the informers whose requests pass through its transport.
type Tracker struct {
	cfg Config

	mu        sync.Mutex
	informers map[string]*informer
	streams   map[*stream]struct{}
}

type informer struct {
	resource     string
	firstSeen    time.Time
	lastProgress time.Time // zero until a list completes or a watch delivers data
	errorSince   time.Time // the first failure since lastProgress; zero when none
	lastError    string
}

// stream is one list or watch request in flight, from the request to the close of its body.
type stream struct {
	key      string
	watch    bool
	lastData time.Time
	cancel   context.CancelFunc
	cut      bool
}

// New returns a Tracker with cfg (zero fields take DefaultConfig's values).
func New(cfg Config) *Tracker {
	def := DefaultConfig()
	if cfg.SilenceLimit <= 0 {
		cfg.SilenceLimit = def.SilenceLimit
	}
	if cfg.BlindAfter <= 0 {
		cfg.BlindAfter = def.BlindAfter
	}
	if cfg.ErrorGrace <= 0 {
		cfg.ErrorGrace = def.ErrorGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Tracker{cfg: cfg, informers: map[string]*informer{}, streams: map[*stream]struct{}{}}
}

// Config returns the tracker's settings.
func (t *Tracker) Config() Config { return t.cfg }

// Blindness is one informer that no longer sees the cluster.
type Blindness struct {
	// Informer names the resource (and namespace) the informer lists and watches:
	// "endpointslices.discovery.k8s.io in shop".
	Informer string
	// Resource is the informer's resource and group without the namespace:
	// "endpointslices.discovery.k8s.io", "pods".
	Resource string
	// Since is when it stopped seeing: its first failed request since it last made progress, or,
	// without a failure, when it last made progress.
	Since time.Time
	// Cause says what failed.
	Cause string
}

func (b Blindness) String() string {
	return fmt.Sprintf("the %s informer has seen nothing since %s: %s", b.Informer, b.Since.UTC().Format(time.RFC3339), b.Cause)
}

// Blind lists the informers that no longer see the cluster, oldest first.
func (t *Tracker) Blind() []Blindness {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	var out []Blindness
	for key, inf := range t.informers {
		last := inf.lastProgress
		if last.IsZero() {
			last = inf.firstSeen
		}
		switch {
		case !inf.errorSince.IsZero() && now.Sub(inf.errorSince) >= t.cfg.ErrorGrace:
			out = append(out, Blindness{Informer: key, Resource: inf.resource, Since: inf.errorSince, Cause: inf.lastError})
		case now.Sub(last) >= t.cfg.BlindAfter:
			out = append(out, Blindness{Informer: key, Resource: inf.resource, Since: last, Cause: fmt.Sprintf(
				"nothing received for longer than %v (no list completed, no event and no bookmark on its watch, though the API server sends a resumed watch one every minute and a silent watch is resumed)",
				t.cfg.BlindAfter)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Since.Equal(out[j].Since) {
			return out[i].Since.Before(out[j].Since)
		}
		return out[i].Informer < out[j].Informer
	})
	return out
}

// CutSilent cuts every list or watch that has delivered nothing for SilenceLimit: the reader of
// a watch gets the end of the stream, as when the API server closes it, and watches again; a list
// fails. It returns the informers cut.
func (t *Tracker) CutSilent() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	var cut []string
	for s := range t.streams {
		if !s.cut && now.Sub(s.lastData) >= t.cfg.SilenceLimit {
			s.cut = true
			s.cancel()
			cut = append(cut, s.key)
		}
	}
	sort.Strings(cut)
	return cut
}

// Run cuts silent streams until ctx ends, checking every tenth of SilenceLimit.
func (t *Tracker) Run(ctx context.Context) {
	ticker := time.NewTicker(max(t.cfg.SilenceLimit/10, 10*time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			t.CutSilent()
		}
	}
}

// Wrap returns a transport that records the informers' requests sent through next, to an API
// server served at the root of its URL. Only lists and watches (GETs of a collection) are
// recorded: an informer sends nothing else.
func (t *Tracker) Wrap(next http.RoundTripper) http.RoundTripper {
	return t.WrapUnder("", next)
}

// WrapUnder is Wrap for an API server served under pathPrefix: the path of its URL before /api
// and /apis, such as Rancher's /k8s/clusters/<cluster id>.
func (t *Tracker) WrapUnder(pathPrefix string, next http.RoundTripper) http.RoundTripper {
	return &transport{t: t, next: next, prefix: strings.TrimSuffix(pathPrefix, "/")}
}

type transport struct {
	t      *Tracker
	next   http.RoundTripper
	prefix string
}

// errCut fails a list or watch cut before the API server answered.
var errCut = errors.New("adaptive-lb cut this list or watch: the API server sent nothing for longer than its bookmark period allows")

func (rt *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, resource, ok := informerKey(req, rt.prefix)
	if !ok {
		return rt.next.RoundTrip(req)
	}
	ctx, cancel := context.WithCancel(req.Context())
	s := rt.t.begin(key, resource, req.URL.Query().Get("watch"), cancel)
	resp, err := rt.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cut := rt.t.end(s)
		cancel()
		if cut {
			err = errCut
		}
		if req.Context().Err() == nil { // the caller's own cancellation is no failure
			rt.t.failed(key, err.Error())
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		rt.t.end(s)
		rt.t.failed(key, rt.t.describe(resp))
		resp.Body = &closer{ReadCloser: resp.Body, onClose: cancel}
		return resp, nil
	}
	resp.Body = &trackedBody{t: rt.t, s: s, body: resp.Body, cancel: cancel}
	return resp, nil
}

func (t *Tracker) begin(key, resource, watch string, cancel context.CancelFunc) *stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	if _, ok := t.informers[key]; !ok {
		t.informers[key] = &informer{resource: resource, firstSeen: now}
	}
	s := &stream{key: key, watch: watch == "true" || watch == "1", lastData: now, cancel: cancel}
	t.streams[s] = struct{}{}
	return s
}

// end forgets a stream and reports whether it was cut.
func (t *Tracker) end(s *stream) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.streams, s)
	return s.cut
}

func (t *Tracker) failed(key, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	inf := t.informers[key]
	if inf.errorSince.IsZero() {
		inf.errorSince = t.cfg.Now()
	}
	inf.lastError = msg
}

// data records that s delivered something; complete says a list has been read to its end.
func (t *Tracker) data(s *stream, complete bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	s.lastData = now
	if s.watch || complete {
		inf := t.informers[s.key]
		inf.lastProgress, inf.errorSince, inf.lastError = now, time.Time{}, ""
	}
}

func (t *Tracker) isCut(s *stream) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.cut
}

type trackedBody struct {
	t      *Tracker
	s      *stream
	body   io.ReadCloser
	cancel context.CancelFunc
	once   sync.Once
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if b.t.isCut(b.s) {
		if b.s.watch {
			return 0, io.EOF // a watch the API server ended: the informer watches again
		}
		return 0, errCut
	}
	if n > 0 || errors.Is(err, io.EOF) {
		b.t.data(b.s, !b.s.watch && errors.Is(err, io.EOF))
	}
	return n, err
}

func (b *trackedBody) Close() error {
	b.once.Do(func() {
		b.t.end(b.s)
		b.cancel()
	})
	return b.body.Close()
}

type closer struct {
	io.ReadCloser
	onClose func()
}

func (c *closer) Close() error {
	c.onClose()
	return c.ReadCloser.Close()
}

// describe is the API server's message for a failed request ("... is forbidden: ...") with the
// HTTP status, or the status alone. The body is put back for the caller.
func (t *Tracker) describe(resp *http.Response) string {
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(data), rest), rest}
	if err != nil {
		return "HTTP " + resp.Status
	}
	msg := ""
	if t.cfg.Describe != nil {
		msg = t.cfg.Describe(resp.StatusCode, resp.Header.Get("Content-Type"), data)
	} else {
		var status struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(data, &status) == nil {
			msg = status.Message
		}
	}
	if msg == "" {
		return "HTTP " + resp.Status
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, resp.StatusCode)
}

// informerKey names the informer a request belongs to: the resource, group and namespace of a
// GET of a collection (a list or a watch) under prefix, e.g. "endpointslices.discovery.k8s.io
// in shop", and the resource alone ("endpointslices.discovery.k8s.io"). It returns false for
// any other request.
func informerKey(req *http.Request, prefix string) (key, resource string, ok bool) {
	if req.Method != http.MethodGet {
		return "", "", false
	}
	path, ok := strings.CutPrefix(req.URL.Path, prefix+"/")
	if !ok {
		return "", "", false
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	var group string
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, rest = parts[1], parts[3:]
	default:
		return "", "", false
	}
	namespace := ""
	switch {
	case len(rest) == 1:
		resource = rest[0]
	case len(rest) == 3 && rest[0] == "namespaces":
		namespace, resource = rest[1], rest[2]
	default:
		return "", "", false
	}
	if group != "" {
		resource += "." + group
	}
	key = resource
	if namespace != "" {
		key += " in " + namespace
	}
	return key, resource, true
}
