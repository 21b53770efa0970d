// Spans of one unit, for the formats whose units share no loads (placed after their file): a span
// is the unit itself.

const SPAN: u32 = 1u;
alias Span = Unit;

fn span_load(row: u32, s: u32) -> Span {
    return unit_head(row, s);
}

fn span_unit(sp: Span, j: u32) -> Unit {
    return sp;
}
