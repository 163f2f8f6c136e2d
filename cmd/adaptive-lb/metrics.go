package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// SCAFFOLD: replaced by the owning work stream before it lands.
func newMetricsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "metrics",
		RunE: func(*cobra.Command, []string) error { return errors.New("metrics: not built yet") },
	}
}
