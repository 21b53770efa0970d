// Spans and parts of one unit, for the formats whose units share no loads (placed after their
// file): a span and its part are the unit itself.

const SPAN: u32 = 1u;
const PART: u32 = 1u;
alias Span = Unit;
alias Part = Unit;

fn span_load(row: u32, s: u32) -> Span {
    return unit_head(row, s);
}

fn part_load(sp: Span, h: u32) -> Part {
    return sp;
}

fn part_unit(pt: Part, j: u32) -> Unit {
    return pt;
}
