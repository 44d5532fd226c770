"""What the model reads: :mod:`.builder` (``left START mention END right``, the ``mention is``
prompt and their token ids, shared with training), :mod:`.documents` (per-document encoder input),
:mod:`.released_style` (the inputs the published models were trained on), :mod:`.short_forms`
(a document's ``{short form: long form}`` table, Schwartz-Hearst or Ab3P's output) and
:mod:`.abbreviations` (scispacy's detector's long forms)."""
