package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBench_RunsTheSuiteAndRewritesOnlyTheGeneratedBlock(t *testing.T) {
	dir := t.TempDir()
	suite := filepath.Join(dir, "suite")
	if err := os.Mkdir(suite, 0o755); err != nil {
		t.Fatal(err)
	}
	scenario := "name: tiny\nduration: 30s\nwarmup: 5s\nload: {rps: 200}\nclients: {proxies: 4}\ncontroller: {interval: 5s}\n" +
		"pods:\n  - {name: fast, replicas: 2, workers: 4, cpu_limit: 1, cost: {mean: 2ms}}\n  - {name: slow, replicas: 2, workers: 4, cpu_limit: 1, speed: 0.5, cost: {mean: 2ms}}\n"
	if err := os.WriteFile(filepath.Join(suite, "tiny.yaml"), []byte(scenario), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(dir, "bench.md")
	before := "# Hand-written\n\nkeep me\n\n" + benchBegin + "\nold table\n" + benchEnd + "\n\ntrailer\n"
	if err := os.WriteFile(doc, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "bench", "--suite", suite, "--doc", doc, "--plots", filepath.Join(dir, "img"), "--policies", "least_request,oracle,capacity")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "| tiny |") || !strings.Contains(out, "p99 / oracle") || !strings.Contains(out, "best α at the edge") {
		t.Fatalf("output:\n%s", out)
	}
	got, _ := os.ReadFile(doc)
	s := string(got)
	if !strings.Contains(s, "keep me") || !strings.Contains(s, "trailer") || strings.Contains(s, "old table") || !strings.Contains(s, "| tiny |") {
		t.Fatalf("doc not rewritten in place:\n%s", s)
	}
	if _, err := os.Stat(filepath.Join(dir, "img", "bench-tiny.png")); err != nil {
		t.Fatalf("plot missing: %v", err)
	}
	if code, _, errOut := runCLI(t, "bench", "--suite", filepath.Join(dir, "none")); code != exitUsageError || !strings.Contains(errOut, "holds no scenario files") {
		t.Fatalf("empty suite: exit %d %q", code, errOut)
	}
}
