// Package benchutil measures memory for the project's benchmarks: the peak heap while a piece of
// work runs, and a process's resident set from /proc. Benchmarks only; nothing in the operator
// imports it.
package benchutil

import (
	"fmt"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// PeakHeap runs f while sampling the bytes held by heap objects (live and not yet swept) every
// 2 ms and once when it returns, and returns the peak above the heap before f (after a collection) and that heap itself.
func PeakHeap(f func()) (peakAbove, before uint64) {
	runtime.GC()
	before = heapObjects()
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // bounded by f's duration
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if h := heapObjects(); h > peak.Load() {
					peak.Store(h)
				}
			}
		}
	}()
	f()
	close(stop)
	<-done
	// A last sample: work shorter than a tick, or holding its most at the end, still counts.
	p := max(peak.Load(), heapObjects())
	return p - min(p, before), before
}

func heapObjects() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// ProcessMemory returns the resident set (VmRSS) and its peak (VmHWM) in bytes of the process
// pid ("self" for this one), from /proc; zeros where /proc is unavailable.
func ProcessMemory(pid string) (rss, hwm uint64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%s/status", pid))
	if err != nil {
		return 0, 0
	}
	for line := range strings.Lines(string(raw)) {
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// ProcessAnonymousMemory returns the resident memory (RssAnon) in bytes of the process pid that
// is its own (heap, stacks), without the pages of its binary and libraries (RssFile), which the
// kernel can drop and read again under a memory limit; zero where /proc is unavailable.
func ProcessAnonymousMemory(pid string) uint64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%s/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(raw)) {
		if value, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
