package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// cgroupMemoryMax is where cgroup v2 exposes the container's memory limit.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// memoryLimitShare is the part of the container's memory limit the Go heap may grow to before the
// collector works harder: the rest is for goroutine stacks, the runtime and the page cache the
// kernel counts against the container.
const memoryLimitShare = 0.9

// setMemoryLimitFromCgroup gives the Go runtime a soft memory limit at 90% of the container's
// limit, unless GOMEMLIMIT is set. Without it the collector lets the heap grow to twice the live
// data (GOGC=100), and an operator whose cache is most of its memory would be OOM-killed at about
// half the cluster size its limit could hold. It returns the limit set, or 0.
func setMemoryLimitFromCgroup(path string) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0 // not in a cgroup v2 container
	}
	limit, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || limit <= 0 {
		return 0 // "max": no limit
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}
