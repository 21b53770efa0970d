//! Where a shader compiler could contract `a * b + c` into a fused multiply-add, found in a WGSL
//! module's naga IR.
//!
//! A GPU compiler may fuse a multiply whose result is added (Vulkan allows it unless an operation
//! is marked `NoContraction`, which neither naga nor Tint emits), and it decides per pipeline and
//! per branch: two pipelines of one kernel, or two branches of one pipeline, can then round the
//! same row differently. A kernel whose rows go through different code (the matmul: two pipelines
//! of row groups, a branch per group size) keeps a row's bits only if none of its float adds is
//! fed by a multiply, except through an explicit `fma`. This walks every path a value takes from
//! the entry point, as a compiler that inlines every call sees it, and reports:
//! - a float add or subtract with an operand whose last operation may be a multiply (a `*`, a `/`,
//!   which may be a multiply by a reciprocal, or their negation), through `let`s, local variables,
//!   function arguments, results and pointer arguments;
//! - an `fma(a, b, c)` whose `a` or `b` may be the literal 1 while the other may be a product (a
//!   compiler folds `fma(x, 1, c)` into `x + c`);
//! - a builtin whose own expansion is a compiler's sum of products (`dot`, `mix`, `length`, ...) and
//!   a float `%`.
//!
//! Facts flow through a function without regard to order (every store to a variable reaches
//! every load of it), but calls are analysed per call site with their arguments' facts, as
//! inlining would.

use std::collections::{BTreeSet, HashMap};

use naga::{
    BinaryOperator, Block, Expression, Function, Handle, Literal, MathFunction, Module, ScalarKind,
    Statement, TypeInner, UnaryOperator,
};

/// What a value may be: the result of a multiply (its last operation), the literal 1.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
struct Fact {
    product: bool,
    one: bool,
}

impl Fact {
    fn join(self, o: Fact) -> Fact {
        Fact { product: self.product || o.product, one: self.one || o.one }
    }
}

/// A function's effect on its caller: its result's fact and what it stores through each
/// pointer argument.
#[derive(Clone, Default)]
struct Summary {
    result: Fact,
    stores: Vec<Fact>,
}

/// The contractable spots of `source`'s entry point `entry`, each as "function: what" (empty:
/// none). Panics where the source does not parse or validate.
pub fn contractable(source: &str, entry: &str) -> BTreeSet<String> {
    let module =
        naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{}", e.emit_to_string(source)));
    let info =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}"));
    let (index, ep) =
        module.entry_points.iter().enumerate().find(|(_, ep)| ep.name == entry).expect("entry point");
    let mut walker =
        Walker { source, module: &module, info: &info, memo: HashMap::new(), found: BTreeSet::new() };
    let builtins = vec![Fact::default(); ep.function.arguments.len()];
    walker.function(&ep.function, FnInfo::Entry(index), &builtins);
    walker.found
}

#[derive(Clone, Copy)]
enum FnInfo {
    Entry(usize),
    Plain(Handle<Function>),
}

struct Walker<'m> {
    source: &'m str,
    module: &'m Module,
    info: &'m naga::valid::ModuleInfo,
    memo: HashMap<(Handle<Function>, Vec<Fact>), Summary>,
    found: BTreeSet<String>,
}

/// One evaluation of a function with its arguments' facts.
struct Frame<'f> {
    func: &'f Function,
    info: &'f naga::valid::FunctionInfo,
    args: Vec<Fact>,
    locals: Vec<Fact>,
    calls: HashMap<Handle<Expression>, Fact>,
    summary: Summary,
    changed: bool,
}

impl<'m> Walker<'m> {
    fn function(&mut self, func: &'m Function, which: FnInfo, args: &[Fact]) -> Summary {
        if let FnInfo::Plain(h) = which {
            if let Some(s) = self.memo.get(&(h, args.to_vec())) {
                return s.clone();
            }
        }
        let info = match which {
            FnInfo::Entry(i) => self.info.get_entry_point(i),
            FnInfo::Plain(h) => &self.info[h],
        };
        let mut frame = Frame {
            func,
            info,
            args: args.to_vec(),
            locals: vec![Fact::default(); func.local_variables.len()],
            calls: HashMap::new(),
            summary: Summary { result: Fact::default(), stores: vec![Fact::default(); args.len()] },
            changed: false,
        };
        for (i, (_, var)) in func.local_variables.iter().enumerate() {
            if let Some(init) = var.init {
                frame.locals[i] = self.fact(&frame, init);
            }
        }
        // to a fixed point: every store reaches every load
        loop {
            frame.changed = false;
            self.block(&mut frame, &func.body);
            if !frame.changed {
                break;
            }
        }
        let name = func.name.clone().unwrap_or_default();
        for (e, _) in func.expressions.iter() {
            if let Some(what) = self.violation(&frame, e) {
                self.found.insert(format!("{name}: {what}"));
            }
        }
        if let FnInfo::Plain(h) = which {
            self.memo.insert((h, args.to_vec()), frame.summary.clone());
        }
        frame.summary
    }

    fn block(&mut self, f: &mut Frame<'m>, block: &'m Block) {
        for s in block.iter() {
            match s {
                Statement::Block(b) => self.block(f, b),
                Statement::If { accept, reject, .. } => {
                    self.block(f, accept);
                    self.block(f, reject);
                }
                Statement::Switch { cases, .. } => cases.iter().for_each(|c| self.block(f, &c.body)),
                Statement::Loop { body, continuing, .. } => {
                    self.block(f, body);
                    self.block(f, continuing);
                }
                Statement::Store { pointer, value } => {
                    let v = self.fact(f, *value);
                    self.store(f, *pointer, v);
                }
                Statement::Return { value: Some(v) } => {
                    let v = self.fact(f, *v);
                    f.summary.result = f.summary.result.join(v);
                }
                Statement::Call { function, arguments, result } => {
                    let facts: Vec<Fact> = arguments.iter().map(|&a| self.argument(f, a)).collect();
                    let callee = &self.module.functions[*function];
                    let s = self.function(callee, FnInfo::Plain(*function), &facts);
                    for (&a, &stored) in arguments.iter().zip(&s.stores) {
                        if stored != Fact::default() {
                            self.store(f, a, stored);
                        }
                    }
                    if let Some(r) = result {
                        let old = f.calls.get(r).copied().unwrap_or_default();
                        let new = old.join(s.result);
                        if new != old {
                            f.calls.insert(*r, new);
                            f.changed = true;
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// An argument's fact: a pointer's, its variable's
    fn argument(&self, f: &Frame, a: Handle<Expression>) -> Fact {
        match self.root(f, a) {
            Some(Root::Local(i)) => f.locals[i],
            Some(Root::Arg(i)) => f.args[i],
            None => self.fact(f, a),
        }
    }

    fn store(&self, f: &mut Frame, pointer: Handle<Expression>, v: Fact) {
        let slot = match self.root(f, pointer) {
            Some(Root::Local(i)) => &mut f.locals[i],
            Some(Root::Arg(i)) => {
                f.summary.stores[i] = f.summary.stores[i].join(v);
                &mut f.args[i]
            }
            None => return, // memory: a compiler does not fuse across a store and a load
        };
        let new = slot.join(v);
        if new != *slot {
            *slot = new;
            f.changed = true;
        }
    }

    /// The function-local variable (or pointer argument) a pointer expression points into
    fn root(&self, f: &Frame, e: Handle<Expression>) -> Option<Root> {
        match f.func.expressions[e] {
            Expression::LocalVariable(h) => Some(Root::Local(h.index())),
            Expression::FunctionArgument(i) => {
                let ty = f.func.arguments[i as usize].ty;
                matches!(self.module.types[ty].inner, TypeInner::Pointer { .. })
                    .then_some(Root::Arg(i as usize))
            }
            Expression::Access { base, .. } | Expression::AccessIndex { base, .. } => self.root(f, base),
            _ => None,
        }
    }

    fn is_float(&self, f: &Frame, e: Handle<Expression>) -> bool {
        let inner = f.info[e].ty.inner_with(&self.module.types);
        inner.scalar_kind() == Some(ScalarKind::Float) && !matches!(inner, TypeInner::Pointer { .. })
    }

    fn fact(&self, f: &Frame, e: Handle<Expression>) -> Fact {
        let product = Fact { product: true, one: false };
        match &f.func.expressions[e] {
            Expression::Literal(l) => Fact { product: false, one: literal_one(l) },
            Expression::Constant(c) => {
                let init = self.module.constants[*c].init;
                Fact { product: false, one: self.global_one(init) }
            }
            Expression::Compose { components, .. } => {
                components.iter().fold(Fact::default(), |a, &c| a.join(self.fact(f, c)))
            }
            Expression::Splat { value, .. } => self.fact(f, *value),
            Expression::Swizzle { vector, .. } => self.fact(f, *vector),
            Expression::Access { base, .. } | Expression::AccessIndex { base, .. } => {
                if self.root(f, e).is_some() {
                    Fact::default()
                } else {
                    self.fact(f, *base)
                }
            }
            Expression::FunctionArgument(i) => f.args[*i as usize],
            Expression::Load { pointer } => match self.root(f, *pointer) {
                Some(Root::Local(i)) => f.locals[i],
                Some(Root::Arg(i)) => f.args[i],
                None => Fact::default(),
            },
            Expression::Unary { op: UnaryOperator::Negate, expr } => {
                Fact { one: false, ..self.fact(f, *expr) }
            }
            Expression::Binary { op: BinaryOperator::Multiply | BinaryOperator::Divide, .. }
                if self.is_float(f, e) =>
            {
                product
            }
            Expression::Select { accept, reject, .. } => self.fact(f, *accept).join(self.fact(f, *reject)),
            Expression::Math { fun: MathFunction::Abs, arg, .. } => Fact { one: false, ..self.fact(f, *arg) },
            Expression::Math { fun, .. } if compound(*fun) => product,
            Expression::As { expr, convert: Some(_), .. }
                if self.is_float(f, *expr) && self.is_float(f, e) =>
            {
                self.fact(f, *expr)
            }
            Expression::CallResult(_) => f.calls.get(&e).copied().unwrap_or_default(),
            _ => Fact::default(),
        }
    }

    fn violation(&self, f: &Frame, e: Handle<Expression>) -> Option<String> {
        match &f.func.expressions[e] {
            Expression::Binary { op: op @ (BinaryOperator::Add | BinaryOperator::Subtract), left, right }
                if self.is_float(f, e) =>
            {
                let (l, r) = (self.fact(f, *left), self.fact(f, *right));
                (l.product || r.product).then(|| format!("{op:?} of a product ({})", self.describe(f, e)))
            }
            Expression::Binary { op: BinaryOperator::Modulo, .. } if self.is_float(f, e) => {
                Some("float %".to_string())
            }
            Expression::Math { fun: MathFunction::Fma, arg, arg1: Some(b), .. } => {
                let (a, b) = (self.fact(f, *arg), self.fact(f, *b));
                ((a.product && b.one) || (b.product && a.one))
                    .then(|| format!("fma of a product by a literal 1 ({})", self.describe(f, e)))
            }
            Expression::Math { fun, .. } if compound(*fun) && self.is_float(f, e) => Some(format!("{fun:?}")),
            _ => None,
        }
    }

    /// Where an expression is: its source line (of the whole module's source)
    fn describe(&self, f: &Frame, e: Handle<Expression>) -> String {
        let span = f.func.expressions.get_span(e);
        if !span.is_defined() {
            return format!("expression {}", e.index());
        }
        let line = span.location(self.source).line_number as usize;
        let text = self.source.lines().nth(line.saturating_sub(1)).unwrap_or("").trim();
        format!("line {line}: {text}")
    }

    /// Whether a module-scope constant expression is 1 (a scalar, or every component of a vector)
    fn global_one(&self, e: Handle<Expression>) -> bool {
        match &self.module.global_expressions[e] {
            Expression::Literal(l) => literal_one(l),
            Expression::Splat { value, .. } => self.global_one(*value),
            Expression::Compose { components, .. } => components.iter().any(|&c| self.global_one(c)),
            _ => false,
        }
    }
}

enum Root {
    Local(usize),
    Arg(usize),
}

fn literal_one(l: &Literal) -> bool {
    match *l {
        Literal::F32(v) => v == 1.0,
        Literal::F64(v) | Literal::AbstractFloat(v) => v == 1.0,
        Literal::F16(v) => v.to_f32() == 1.0,
        _ => false,
    }
}

/// Builtins whose expansion is a compiler's own sum of products
fn compound(fun: MathFunction) -> bool {
    use MathFunction::*;
    matches!(
        fun,
        Dot | Outer
            | Cross
            | Distance
            | Length
            | Normalize
            | FaceForward
            | Reflect
            | Refract
            | Mix
            | SmoothStep
            | Determinant
            | Inverse
            | Modf
    )
}
