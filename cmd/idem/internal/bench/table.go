package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints results and ratios as aligned text tables.
func WriteTable(w io.Writer, rs []Result, ratios []Ratio) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tinbox\tclaims\tworkers\tbatch\tevents\tevents/s\tp50 ms\tp99 ms\tallocs/ev\tbytes/ev\theap MiB\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", r.Case, r.Inbox, r.Claims, r.Concurrency, r.Batch, r.Events, r.EventsPerS,
			opt(r.P50MS, "%.1f"), opt(r.P99MS, "%.1f"), opt(r.AllocsPerEv, "%.1f"), opt(r.BytesPerEv, "%.0f"), opt(r.HeapMiB, "%.1f"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ratios) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ratio\tvalue\ttarget\tmet")
	for _, r := range ratios {
		cmp := ">="
		if !r.Min {
			cmp = "<="
		}
		met := "yes"
		if !r.OK {
			met = "NO"
		}
		if r.Target == 0 {
			fmt.Fprintf(tw, "%s\t%.2f\t-\t-\n", r.Name, r.Value) // measured, no target
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%s %.2f\t%s\n", r.Name, r.Value, cmp, r.Target, met)
	}
	return tw.Flush()
}

func opt(v float64, format string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
