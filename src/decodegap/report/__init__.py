"""The views of an Analysis, and the only place that formats: one view model (`view`) laid out as terminal text
(`text`), Markdown (`markdown`) and HTML with SVG plots (`html`); the JSON report (`json`); `decodegap floor`'s
tables (`floor`); two reports side by side (`diff`); the Perfetto overlay (`annotate`); the load progress bar
(`progress`).

May import: analysis, pipeline and every stage below (annotate re-reads the traces it writes over); never api/ or
commands/."""
