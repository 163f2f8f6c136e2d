package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// SCAFFOLD: replaced by the owning work stream before it lands.
func newSimulateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "simulate",
		RunE: func(*cobra.Command, []string) error { return errors.New("simulate: not built yet") },
	}
}
