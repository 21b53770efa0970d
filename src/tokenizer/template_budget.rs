//! The byte budget of one chat-template render.
//!
//! minijinja's fuel counts instructions, and one instruction can double a string
//! (`{% set ns.s = ns.s ~ ns.s %}`), so fuel alone lets thirty instructions ask for gigabytes and
//! abort the process (or the browser worker) on a failed allocation. minijinja has no memory
//! limit of its own, so the compiled template is rewritten before each render: every instruction
//! that makes text asks this budget first, on the sizes of its inputs, before it allocates.
//!
//! - `~`, `+`, `*` and `in` (which stringifies a non-string needle) get a guard call before them
//!   that charges the size of their result and hands the operands back (`UnpackList`).
//! - Every emit, into the output or into a capture (`{% set %}` blocks, macro bodies, filter
//!   blocks), charges its text, raw template text too, and no capture grows past one value's
//!   limit.
//! - Filters and string methods that can amplify (join, replace, indent, format, tojson, pprint,
//!   list, sum, and any that turns a list or map argument into text) are wrapped by checks on
//!   their arguments; whatever a filter, method, function or slice returns is charged after.
//!
//! Charges only add up, so the total is an upper bound of what the render holds at any time: at
//! most [`RENDER_BUDGET`] bytes, no value over [`MAX_VALUE_BYTES`]. Templates cannot shadow the
//! guards: a name with the guards' prefix is refused.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{filters, AutoEscape, Environment, Error, ErrorKind, State};

/// All the text one render may make, summed over every value and emit.
pub const RENDER_BUDGET: usize = 64 << 20;
/// The largest single value (or output) one render may make.
pub const MAX_VALUE_BYTES: usize = 16 << 20;

/// The prefix of the guard functions' names; templates may not use it.
const PREFIX: &str = "__wgspec_";
const CONCAT: &str = "__wgspec_concat";
const ADD: &str = "__wgspec_add";
const MUL: &str = "__wgspec_mul";
const IN: &str = "__wgspec_in";
const EMIT: &str = "__wgspec_emit";
const CHARGE: &str = "__wgspec_charge";
const MADE: &str = "__wgspec_made";
const BEGIN: &str = "__wgspec_begin_capture";
const END: &str = "__wgspec_end_capture";

thread_local! {
    /// Bytes the render on this thread may still make (`usize::MAX` outside a render).
    static LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Bytes emitted into the output (first) and into each open capture, innermost last.
    static OPEN: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Runs `render` with a fresh [`RENDER_BUDGET`] on this thread.
pub fn with_budget<T>(render: impl FnOnce() -> T) -> T {
    let before = LEFT.with(|left| left.replace(RENDER_BUDGET));
    let open = OPEN.with(|open| open.replace(vec![0]));
    let out = render();
    LEFT.with(|left| left.set(before));
    OPEN.with(|o| *o.borrow_mut() = open);
    out
}

/// Emits `bytes` into the innermost capture (or the output): charged, and no capture grows past
/// [`MAX_VALUE_BYTES`] however many emits fill it. (A macro's body is captured by minijinja
/// itself, so its emits count toward the capture around the call too: an over-count.)
fn emit(bytes: usize) -> Result<(), Error> {
    charge(bytes)?;
    OPEN.with(|open| {
        let mut open = open.borrow_mut();
        let top_level = open.len() == 1;
        match open.last_mut() {
            Some(filled) if filled.saturating_add(bytes) > MAX_VALUE_BYTES => Err(if top_level {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("the template's output exceeds {MAX_VALUE_BYTES} bytes"),
                )
            } else {
                over(filled.saturating_add(bytes))
            }),
            Some(filled) => {
                *filled += bytes;
                Ok(())
            }
            None => Ok(()),
        }
    })
}

/// The budget's error (mapped to `Error::ChatTemplate` with minijinja's location).
fn over(asked: usize) -> Error {
    let limit = if asked > MAX_VALUE_BYTES {
        format!("a value of {asked} bytes (the limit is {MAX_VALUE_BYTES})")
    } else {
        format!("more than {RENDER_BUDGET} bytes of text in all")
    };
    Error::new(ErrorKind::InvalidOperation, format!("the template makes {limit}"))
}

/// Takes `bytes` from the render's budget.
fn charge(bytes: usize) -> Result<(), Error> {
    LEFT.with(|left| {
        if bytes > MAX_VALUE_BYTES || bytes > left.get() {
            return Err(over(bytes));
        }
        left.set(left.get() - bytes);
        Ok(())
    })
}

/// The most one more value may take: the value limit or what is left, whichever is smaller.
fn room() -> usize {
    LEFT.with(|left| left.get()).min(MAX_VALUE_BYTES)
}

/// A `fmt::Write` that counts and gives up past `cutoff`.
struct Counter {
    bytes: usize,
    cutoff: usize,
}

impl std::fmt::Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.bytes = self.bytes.saturating_add(s.len());
        if self.bytes > self.cutoff {
            return Err(std::fmt::Error);
        }
        Ok(())
    }
}

/// The length of `value` as text (what `~`, an emit or a string argument makes of it), counted
/// no further than just past [`room`]: the work is bounded by what a charge may take.
fn text_len(value: &Value) -> usize {
    if let Some(s) = value.as_str() {
        return s.len();
    }
    let mut counter = Counter { bytes: 0, cutoff: room() };
    let _ = write!(counter, "{value}");
    counter.bytes
}

/// The same for minijinja's pretty-printed debug form (`pprint`).
fn pretty_len(value: &Value) -> usize {
    let mut counter = Counter { bytes: 0, cutoff: room() };
    let _ = write!(counter, "{value:#?}");
    counter.bytes
}

/// Lists, maps and objects: values whose text can be far larger than they are.
fn structured(value: &Value) -> bool {
    !matches!(
        value.kind(),
        ValueKind::Undefined | ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::String
    )
}

/// What a value just made holds: a string's bytes, a list's or map's slots (its items are
/// charged where they were made). A lazily joined list (`a + b`) is charged as if copied: later
/// filters iterate or copy it, and the charge keeps every list under a few million items.
fn owned_len(value: &Value) -> usize {
    match value.kind() {
        ValueKind::String => value.as_str().map_or(0, str::len),
        ValueKind::Bytes => value.as_bytes().map_or(0, <[u8]>::len),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => value.len().unwrap_or(0).saturating_mul(32),
        _ => 0,
    }
}

/// The items of `value` as far as the budget can pay for them, summed with `per_item`; `None` if
/// the value cannot be iterated (the filter then reports its own error).
fn items_len(value: &Value, per_item: impl Fn(&Value) -> usize) -> Option<usize> {
    let limit = room();
    let mut total = 0usize;
    for item in value.try_iter().ok()? {
        total = total.saturating_add(per_item(&item));
        if total > limit {
            break;
        }
    }
    Some(total)
}

/// Every run of digits in `text` summed: the widths and precisions a format string asks for.
fn widths(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|run| !run.is_empty())
        .map(|run| run.parse::<usize>().unwrap_or(usize::MAX))
        .fold(0usize, usize::saturating_add)
}

/// A bound on the bytes `name(args)` makes (the filter's input is `args[0]`).
fn filter_cost(name: &str, args: &[Value]) -> usize {
    // Any list, map or object argument may be turned into text.
    let mut cost = args.iter().filter(|a| structured(a)).map(text_len).fold(0usize, usize::saturating_add);
    let text = |i: usize| args.get(i).map_or(0, text_len);
    cost = cost.saturating_add(match name {
        // a joiner between every two items, each item as text
        "join" => {
            let joiner = text(1);
            args.first().and_then(|v| items_len(v, |item| text_len(item).saturating_add(joiner))).unwrap_or(0)
        }
        // every match (or, for an empty pattern, every gap) becomes the replacement
        "replace" => {
            let (len, from, to) = (text(0), text(1), text(2));
            len.saturating_add((len / from.max(1)).saturating_add(1).saturating_mul(to))
        }
        // the indentation on every line
        "indent" => {
            let lines = args.first().and_then(Value::as_str).map_or(1, |s| s.lines().count() + 1);
            let width = args.get(1).map_or(4, |w| w.as_usize().unwrap_or_else(|| text_len(w)));
            text(0).saturating_add(lines.saturating_mul(width))
        }
        // every placeholder may take every argument, padded to every width written
        "format" => {
            let format = args.first().and_then(Value::as_str).unwrap_or("");
            let holes = format.matches(['%', '{']).count();
            let all_args = args[1.min(args.len())..].iter().map(text_len).fold(0usize, usize::saturating_add);
            format.len().saturating_add(widths(format)).saturating_add(holes.saturating_mul(all_args))
        }
        // JSON escapes each character into at most six; indentation on every line
        "tojson" => {
            let indent = args.get(1).and_then(Value::as_usize).unwrap_or(2);
            text(0).saturating_mul(6).saturating_mul(indent.saturating_add(1))
        }
        "pprint" => args.first().map_or(0, pretty_len),
        // a string's characters become values of their own
        "list" if args.first().is_some_and(|v| v.kind() == ValueKind::String) => text(0).saturating_mul(32),
        "split" | "lines" => text(0).saturating_mul(32),
        // summing strings concatenates them
        "sum" => args.first().and_then(|v| items_len(v, text_len)).unwrap_or(0),
        // escaping at most six bytes per byte, case mapping at most three
        "escape" | "e" => text(0).saturating_mul(6),
        _ => text(0).saturating_mul(3),
    });
    cost
}

/// A bound on the bytes the string method `receiver.name(args)` makes.
fn method_cost(receiver: &Value, name: &str, args: &[Value]) -> usize {
    let Some(s) = receiver.as_str() else { return 0 };
    let mut with_receiver = Vec::with_capacity(args.len() + 1);
    with_receiver.push(receiver.clone());
    with_receiver.extend_from_slice(args);
    match name {
        // `sep.join(items)` is `items|join(sep)`
        "join" => filter_cost("join", &[args.first().cloned().unwrap_or_default(), receiver.clone()]),
        "replace" | "format" | "split" | "splitlines" => {
            filter_cost(if name == "splitlines" { "lines" } else { name }, &with_receiver)
        }
        _ => s.len().saturating_mul(3),
    }
}

/// Registers the guard functions and wraps the amplifying filters and the string methods.
/// `methods` is the callback for Python-style methods (minijinja-contrib's pycompat).
pub fn install(
    env: &mut Environment<'static>,
    methods: fn(&State, &Value, &str, &[Value]) -> Result<Value, Error>,
) {
    // `a ~ b`: the operands handed back in the order `UnpackList` pushes them.
    env.add_function(CONCAT, |a: Value, b: Value| -> Result<Value, Error> {
        charge(text_len(&a).saturating_add(text_len(&b)))?;
        Ok(Value::from(vec![b, a]))
    });
    env.add_function(ADD, |a: Value, b: Value| -> Result<Value, Error> {
        let cost = match (a.as_str(), b.as_str()) {
            (Some(x), Some(y)) => x.len().saturating_add(y.len()),
            // lists are joined lazily, or copied as slots when the chain gets deep
            _ => owned_len(&a).saturating_add(owned_len(&b)),
        };
        charge(cost)?;
        Ok(Value::from(vec![b, a]))
    });
    env.add_function(MUL, |a: Value, b: Value| -> Result<Value, Error> {
        let times = |n: &Value| n.as_usize().unwrap_or(0);
        let cost = match (a.kind(), b.kind()) {
            (ValueKind::String, _) => text_len(&a).saturating_mul(times(&b)),
            (_, ValueKind::String) => text_len(&b).saturating_mul(times(&a)),
            (ValueKind::Seq | ValueKind::Iterable, _) => owned_len(&a).saturating_mul(times(&b)),
            (_, ValueKind::Seq | ValueKind::Iterable) => owned_len(&b).saturating_mul(times(&a)),
            _ => 0,
        };
        charge(cost)?;
        Ok(Value::from(vec![b, a]))
    });
    // `needle in text` turns a non-string needle into text
    env.add_function(IN, |needle: Value, container: Value| -> Result<Value, Error> {
        if container.kind() == ValueKind::String && needle.kind() != ValueKind::String {
            charge(text_len(&needle))?;
        }
        Ok(Value::from(vec![container, needle]))
    });
    env.add_function(EMIT, |state: &State, value: Value| -> Result<Value, Error> {
        let escaping = if matches!(state.auto_escape(), AutoEscape::None) { 1 } else { 6 };
        emit(text_len(&value).saturating_mul(escaping))?;
        Ok(value)
    });
    env.add_function(CHARGE, |bytes: usize| emit(bytes));
    env.add_function(BEGIN, || OPEN.with(|open| open.borrow_mut().push(0)));
    env.add_function(END, || {
        OPEN.with(|open| {
            let mut open = open.borrow_mut();
            if open.len() > 1 {
                open.pop();
            }
        })
    });
    env.add_function(MADE, |value: Value| -> Result<Value, Error> {
        charge(owned_len(&value))?;
        Ok(value)
    });
    // The builtin filters that can amplify or that turn a list or map argument into text.
    let checked = [
        ("safe", Value::from_function(filters::safe)),
        ("escape", Value::from_function(filters::escape)),
        ("e", Value::from_function(filters::escape)),
        ("lower", Value::from_function(filters::lower)),
        ("upper", Value::from_function(filters::upper)),
        ("title", Value::from_function(filters::title)),
        ("capitalize", Value::from_function(filters::capitalize)),
        ("replace", Value::from_function(filters::replace)),
        ("trim", Value::from_function(filters::trim)),
        ("join", Value::from_function(filters::join)),
        ("split", Value::from_function(filters::split)),
        ("lines", Value::from_function(filters::lines)),
        ("string", Value::from_function(filters::string)),
        ("indent", Value::from_function(filters::indent)),
        ("pprint", Value::from_function(filters::pprint)),
        ("format", Value::from_function(filters::format)),
        ("tojson", Value::from_function(filters::tojson)),
        ("list", Value::from_function(filters::list)),
        ("sum", Value::from_function(filters::sum)),
    ];
    for (name, builtin) in checked {
        env.add_filter(name, move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
            charge(filter_cost(name, &args))?;
            builtin.call(state, &args)
        });
    }
    env.set_unknown_method_callback(move |state, receiver, name, args| {
        charge(method_cost(receiver, name, args))?;
        methods(state, receiver, name, args)
    });
}

/// `template` rewritten so that every instruction that makes text asks the budget first (see
/// the module's doc). Refuses a template that uses the guards' names.
pub fn guard<'s>(template: &Instructions<'s>) -> Result<Instructions<'s>, Error> {
    let mut out = Instructions::new(template.name(), template.source());
    // where each instruction of `template` starts in `out` (its guard, if any), for the jumps
    let mut moved = Vec::with_capacity(template.len() + 1);
    for pc in 0..template.len() as u32 {
        let Some(instr) = template.get(pc) else { break };
        let line = template.get_line(pc).map_or(0, |l| l.min(u16::MAX as usize) as u16);
        moved.push(out.len() as u32);
        let call = |name: &'static str, args: u16| Instruction::CallFunction(name, Some(args));
        let guarded: Vec<Instruction<'s>> = match instr {
            Instruction::StoreLocal(name) | Instruction::BuildMacro(name, ..) | Instruction::Lookup(name)
                if name.starts_with(PREFIX) =>
            {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("the name {name} is reserved by wgspec's template budget"),
                ));
            }
            Instruction::StringConcat => vec![call(CONCAT, 2), Instruction::UnpackList(2), instr.clone()],
            Instruction::Add => vec![call(ADD, 2), Instruction::UnpackList(2), instr.clone()],
            Instruction::Mul => vec![call(MUL, 2), Instruction::UnpackList(2), instr.clone()],
            Instruction::In => vec![call(IN, 2), Instruction::UnpackList(2), instr.clone()],
            Instruction::Emit => vec![call(EMIT, 1), Instruction::Emit],
            Instruction::BeginCapture(_) => vec![call(BEGIN, 0), Instruction::DiscardTop, instr.clone()],
            Instruction::EndCapture => vec![call(END, 0), Instruction::DiscardTop, instr.clone()],
            Instruction::EmitRaw(text) => vec![
                Instruction::LoadConst(Value::from(text.len())),
                call(CHARGE, 1),
                Instruction::DiscardTop,
                instr.clone(),
            ],
            Instruction::ApplyFilter(..)
            | Instruction::CallMethod(..)
            | Instruction::CallObject(..)
            | Instruction::Slice => vec![instr.clone(), call(MADE, 1)],
            Instruction::CallFunction(name, _) if !name.starts_with(PREFIX) => {
                vec![instr.clone(), call(MADE, 1)]
            }
            _ => vec![instr.clone()],
        };
        for g in guarded {
            out.add_with_line(g, line);
        }
    }
    moved.push(out.len() as u32);
    for pc in 0..out.len() as u32 {
        if let Some(
            Instruction::Jump(to)
            | Instruction::JumpIfFalse(to)
            | Instruction::JumpIfFalseOrPop(to)
            | Instruction::JumpIfTrueOrPop(to)
            | Instruction::Iterate(to)
            | Instruction::BuildMacro(_, to, _),
        ) = out.get_mut(pc)
        {
            *to = moved.get(*to as usize).copied().unwrap_or(*to);
        }
    }
    Ok(out)
}
