package report

import (
	"fmt"
	"io"
	"strings"
)

// WriteMarkdown prints the report as a Markdown table, for pull requests and
// run reviews: the lines of the text report (Lines), a row each.
func WriteMarkdown(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "## tpsprof report: %s\n\n| metric | value |\n|---|---|\n", mdText(r.Job))
	for _, l := range r.Lines() {
		if _, err := fmt.Fprintf(w, "| %s | %s |\n", mdText(orDash(l.Key)), mdText(l.Value)); err != nil {
			return err
		}
	}
	return nil
}

// mdText makes a name safe in a Markdown table cell: HTML is escaped (a
// node or model named "<script>..." renders as text where Markdown is shown
// as HTML), pipes and line breaks cannot end the cell or the row.
func mdText(s string) string {
	return mdEscaper.Replace(s)
}

// MarkdownCell is mdText for other commands' Markdown tables.
func MarkdownCell(s string) string { return mdText(s) }

var mdEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "|", "\\|", "\n", " ", "\r", " ", "`", "\\`")
