package simcli

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runCommand runs the simulate command as a binary would and returns its exit code and output.
func runCommand(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Execute(NewCommand(&Options{}), args, &out, &errb)
	return code, out.String(), errb.String()
}

var policyLine = regexp.MustCompile(`^(\S+) done in \d+\.\d s, p99 (\d+\.\d) ms \((\d) of (\d)\)$`)

func TestRun_PrintsALinePerPolicyAsItFinishesOnStderrOnly(t *testing.T) {
	policies := []string{"least_request", "capacity", "tail"}
	code, out, errOut := runCommand(t, "--duration", "40s", "--warmup", "10s", "--policies", strings.Join(policies, ","))
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if len(lines) != len(policies) {
		t.Fatalf("stderr has %d lines, want one per policy (%d):\n%s", len(lines), len(policies), errOut)
	}
	seen := map[string]bool{}
	for i, line := range lines {
		m := policyLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("stderr line %q is not like %q", line, "tail done in 4.1 s, p99 23.6 ms (3 of 5)")
		}
		if m[3] != strconv.Itoa(i+1) || m[4] != strconv.Itoa(len(policies)) {
			t.Errorf("line %d counts %s of %s, want %d of %d", i+1, m[3], m[4], i+1, len(policies))
		}
		seen[m[1]] = true
		// The line's p99 is the table's.
		row := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(m[1]) + `\s+\S+\s+\S+\s+\S+\s+(\S+)\s`).FindStringSubmatch(out)
		if row == nil || row[1] != m[2] {
			t.Errorf("%s: the progress line says p99 %s ms, the table %v", m[1], m[2], row)
		}
	}
	for _, p := range policies {
		if !seen[p] {
			t.Errorf("no line for %s:\n%s", p, errOut)
		}
	}
	if strings.Contains(out, " done in ") {
		t.Errorf("progress reached stdout:\n%s", out)
	}
	if strings.Contains(errOut, "simulating") {
		t.Errorf("a live percentage was drawn although stderr is not a terminal: %q", errOut)
	}
}

func TestRun_ProgressFalseShowsNoProgress(t *testing.T) {
	code, out, errOut := runCommand(t, "--duration", "30s", "--warmup", "10s", "--policies", "least_request,capacity", "--progress=false")
	if code != ExitOK || !strings.Contains(out, "p99 ms") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if errOut != "" {
		t.Fatalf("--progress=false printed %q", errOut)
	}
}

func TestRun_ProgressTrueErasesThePercentageBeforeEachLine(t *testing.T) {
	code, _, errOut := runCommand(t, "--duration", "30s", "--warmup", "10s", "--policies", "least_request,capacity", "--progress")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "\rsimulating seed-fib: ") {
		t.Fatalf("no live percentage: %q", errOut)
	}
	// What remains once each erase is applied is the policy lines, each on a line of its own.
	var screen []string
	for _, line := range strings.Split(strings.TrimSuffix(errOut, "\n"), "\n") {
		if i := strings.LastIndex(line, "\r\033[K"); i >= 0 {
			line = line[i+len("\r\033[K"):]
		}
		screen = append(screen, line)
	}
	for _, line := range screen {
		if !policyLine.MatchString(line) {
			t.Fatalf("line %q is not a policy line once the percentage is erased; stderr %q", line, errOut)
		}
	}
	if len(screen) != 2 || !strings.HasSuffix(errOut, "\n") {
		t.Fatalf("want two policy lines and a clean last line, stderr %q", errOut)
	}
}
