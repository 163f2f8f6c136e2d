package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	jsoniter "github.com/json-iterator/go"

	"github.com/adaptive-lb/adaptive-lb/internal/benchutil"
)

const (
	benchPods          = 200_000
	benchNamespaces    = 2_000
	benchPodsPerNS     = benchPods / benchNamespaces
	benchEvalUnixMilli = 1795348200_000
)

func benchPodName(ns, i int) (string, string) {
	return fmt.Sprintf("team-%04d", ns), fmt.Sprintf("checkout-7d9f8b6c4d-%05d", i)
}

// benchBody renders a Prometheus API vector response with one series per pod.
func benchBody(value string) []byte {
	var b strings.Builder
	b.Grow(benchPods * 110)
	b.WriteString(`{"status":"success","data":{"resultType":"vector","result":[`)
	for ns := range benchNamespaces {
		for i := range benchPodsPerNS {
			if ns+i > 0 {
				b.WriteByte(',')
			}
			namespace, pod := benchPodName(ns, i)
			fmt.Fprintf(&b, `{"metric":{"namespace":%q,"pod":%q},"value":[1795348200,%q]}`, namespace, pod, value)
		}
	}
	b.WriteString(`]}}`)
	return []byte(b.String())
}

// benchServerEnv turns the test binary into the benchmarks' canned TSDB: it serves the 200,000
// series responses on a loopback port, prints the address, and exits when its stdin closes. A
// separate process keeps the server's canned bodies and their garbage out of the measured heap
// and RSS, as a real TSDB would be.
const benchServerEnv = "ADAPTIVELB_BENCH_TSDB_SERVER"

// benchServerLifetime bounds the server process even if the benchmark never closes its stdin.
const benchServerLifetime = 30 * time.Minute

func TestMain(m *testing.M) {
	if os.Getenv(benchServerEnv) != "" {
		serveBenchTSDB()
		return
	}
	os.Exit(m.Run())
}

// benchHistogramPods is how many pods the canned histogram answer covers: 20 buckets each make
// as many series as one value query's answer for benchPods.
const (
	benchHistogramBuckets = 20
	benchHistogramPods    = benchPods / benchHistogramBuckets
)

// benchHistogramBody renders a latency histogram answer: one series per pod and bucket.
func benchHistogramBody() []byte {
	var b strings.Builder
	b.Grow(benchPods * 130)
	b.WriteString(`{"status":"success","data":{"resultType":"vector","result":[`)
	for p := range benchHistogramPods {
		namespace, pod := benchPodName(p/benchPodsPerNS, p%benchPodsPerNS)
		for k := range benchHistogramBuckets {
			if p+k > 0 {
				b.WriteByte(',')
			}
			le := "+Inf"
			if k < benchHistogramBuckets-1 {
				le = strconv.FormatFloat(math.Pow(2, float64(k)), 'g', -1, 64)
			}
			fmt.Fprintf(&b, `{"metric":{"namespace":%q,"pod":%q,"le":%q},"value":[1795348200,"%d"]}`, namespace, pod, le, 100*(k+1))
		}
	}
	b.WriteString(`]}}`)
	return []byte(b.String())
}

func serveBenchTSDB() {
	values, stamps, histogram := benchBody("0.5"), benchBody("1795348195"), benchHistogramBody()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = r.ParseForm()
			body := values
			switch q := r.Form.Get("query"); {
			case strings.Contains(q, "(timestamp("): // a freshness probe
				body = stamps
			case strings.Contains(q, "istio_request_duration_milliseconds_bucket") && !strings.HasPrefix(q, "histogram_quantile"):
				body = histogram
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		}))
	}()
	closed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(closed) }()
	select {
	case <-closed:
	case <-time.After(benchServerLifetime):
	}
}

// startBenchTSDB runs the canned TSDB in a child process and returns its URL.
func startBenchTSDB(b *testing.B) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchServerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("the canned TSDB process did not print its address: %v", err)
	}
	return "http://" + strings.TrimSpace(addr)
}

// BenchmarkFetch_200kPods decodes and maps one full cycle (4 value queries + 2 freshness probes,
// each answering 200,000 series) served by a canned TSDB in another process, through the real
// client path. It reports the peak heap sampled during the cycles (live and not yet swept, above
// the heap before the first cycle) as peak-heap-MB and the process's peak RSS as peak-rss-MB.
func BenchmarkFetch_200kPods(b *testing.B) {
	url := startBenchTSDB(b)
	pods := make([]Pod, 0, benchPods)
	for ns := range benchNamespaces {
		for i := range benchPodsPerNS {
			namespace, pod := benchPodName(ns, i)
			pods = append(pods, Pod{Namespace: namespace, Name: pod, CPULimitCores: 2})
		}
	}
	// Without the latency histogram: at 200,000 pods its 4 million series would pass the response
	// limit (docs/metrics.md); BenchmarkQuery_LatencyHistogram_200kSeries measures its decoding.
	src, err := New(Config{URL: url, Timeout: time.Minute, DisableLatencyHistogram: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	req := Request{Pods: pods, Now: time.UnixMilli(benchEvalUnixMilli), Window: time.Minute, Interval: 10 * time.Second}

	b.ReportAllocs()
	b.ResetTimer()
	peak, _ := benchutil.PeakHeap(func() {
		for b.Loop() {
			batch, err := src.Fetch(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			if last := batch.Observations[benchPods-1]; !last.CPUCores.Usable() || last.CPUCores.Value != 0.5 {
				b.Fatalf("last pod not mapped: %+v", last.CPUCores)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(peak)/1e6, "peak-heap-MB")
	b.ReportMetric(float64(peakRSS())/1e6, "peak-rss-MB")
}

// BenchmarkQuery_200kSeries isolates one signal: one 200,000-series response sent, streamed through
// the decoder and split by pod.
func BenchmarkQuery_200kSeries(b *testing.B) {
	src, err := New(Config{URL: startBenchTSDB(b), Timeout: time.Minute}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ps := src.(*prometheusSource)
	pods := make([]Pod, 0, benchPods)
	for ns := range benchNamespaces {
		for i := range benchPodsPerNS {
			namespace, pod := benchPodName(ns, i)
			pods = append(pods, Pod{Namespace: namespace, Name: pod})
		}
	}
	index, _ := newPodIndex(pods)
	b.ReportAllocs()
	for b.Loop() {
		decoded, _, err := ps.query(context.Background(), "up", time.UnixMilli(benchEvalUnixMilli), index, false)
		got := decoded.result
		if err != nil {
			b.Fatal(err)
		}
		if n := got.pods(); n != benchPods {
			b.Fatalf("%d pods mapped", n)
		}
	}
	b.ReportMetric(float64(peakRSS())/1e6, "peak-rss-MB")
}

// BenchmarkQuery_LatencyHistogram_200kSeries decodes the latency histogram query's answer for
// 10,000 pods of 20 buckets (200,000 series, as many as BenchmarkQuery_200kSeries) into per-pod
// buckets.
func BenchmarkQuery_LatencyHistogram_200kSeries(b *testing.B) {
	src, err := New(Config{URL: startBenchTSDB(b), Timeout: time.Minute}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ps := src.(*prometheusSource)
	pods := make([]Pod, 0, benchHistogramPods)
	for p := range benchHistogramPods {
		namespace, pod := benchPodName(p/benchPodsPerNS, p%benchPodsPerNS)
		pods = append(pods, Pod{Namespace: namespace, Name: pod})
	}
	index, _ := newPodIndex(pods)
	text, err := RenderQuery(histogramQueryName, DefaultLatencyHistogramQuery, NewTemplateData(nil, "", time.Minute, DefaultLabels))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		decoded, _, err := ps.query(context.Background(), text, time.UnixMilli(benchEvalUnixMilli), index, true)
		if err != nil {
			b.Fatal(err)
		}
		last := int32(benchHistogramPods - 1)
		if got, err := decoded.buckets.at(last, index.keys[last]); err != nil || len(got) != benchHistogramBuckets {
			b.Fatalf("last pod: %d buckets, %v", len(got), err)
		}
	}
	b.ReportMetric(float64(peakRSS())/1e6, "peak-rss-MB")
}

// BenchmarkStreamingDecodeAlternative_200kSeries is evidence for a design decision, not a
// production path: it decodes the same 200,000-series body with json-iterator's streaming
// Iterator straight into per-pod values (no model.Vector, no RawMessage copies), to show what
// leaving client_golang's v1 decoding would buy. See docs/benchmarks.md.
func BenchmarkStreamingDecodeAlternative_200kSeries(b *testing.B) {
	body := benchBody("0.5")
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		values := make(map[podKey]float64, benchPods)
		iter := jsoniter.ConfigFastest.BorrowIterator(body)
		iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
			if field != "data" {
				iter.Skip()
				return true
			}
			return iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
				if field != "result" {
					iter.Skip()
					return true
				}
				return iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
					var key podKey
					var value float64
					iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
						switch field {
						case "metric":
							iter.ReadMapCB(func(iter *jsoniter.Iterator, label string) bool {
								switch label {
								case "namespace":
									key.namespace = iter.ReadString()
								case "pod":
									key.name = iter.ReadString()
								default:
									iter.Skip()
								}
								return true
							})
						case "value":
							iter.ReadArray()
							iter.Skip() // timestamp
							iter.ReadArray()
							value, _ = strconv.ParseFloat(iter.ReadString(), 64)
							iter.ReadArray()
						default:
							iter.Skip()
						}
						return true
					})
					values[key] = value
					return true
				})
			})
		})
		if iter.Error != nil || len(values) != benchPods {
			b.Fatalf("decoded %d pods: %v", len(values), iter.Error)
		}
		jsoniter.ConfigFastest.ReturnIterator(iter)
	}
}

// peakRSS is the benchmark process's high-water resident set in bytes.
func peakRSS() uint64 {
	_, hwm := benchutil.ProcessMemory("self")
	return hwm
}
