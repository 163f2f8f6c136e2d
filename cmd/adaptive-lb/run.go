package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// SCAFFOLD: replaced by the owning work stream before it lands.
func newRunCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		RunE: func(*cobra.Command, []string) error { return errors.New("run: not built yet") },
	}
}
