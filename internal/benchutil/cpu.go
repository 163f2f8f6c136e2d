package benchutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ChildCPUSeconds returns the CPU time (user+system) used so far by this process's child named
// comm (e.g. the kube-apiserver envtest started), 0 when there is none.
func ChildCPUSeconds(comm string) float64 {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15), counted from the field after comm.
		line := string(raw)
		open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
		if open < 0 || end < open || line[open+1:end] != comm {
			continue
		}
		fields := strings.Fields(line[end+1:])
		if len(fields) < 13 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		return (utime + stime) / clockTicksPerSecond
	}
	return 0
}

// clockTicksPerSecond is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicksPerSecond = 100
