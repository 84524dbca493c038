"""Long original prose for the builtin task's summarisation sample (written for this project).

The document is a fictional report (about 2,000 words), long enough to make a "long prompt" for any tokenizer.
"""

LONG_DOCUMENT = """\
The Millbrook Footbridge: A Report to the Town Council on the First Two Years

1. Background

Millbrook is a town of about eleven thousand people divided by the Alder, a slow, brown river that \
floods most springs. For more than a century the only crossing inside the town was the Stone Bridge on \
Market Street, a narrow arch built for carts and now used by buses, delivery lorries, school traffic and \
every cyclist who lives on the east bank and works on the west. Pedestrians share a pavement barely wide \
enough for a pram. In the council's own survey, carried out four years ago, six residents in ten said \
they avoided walking into the centre because the bridge felt unsafe, and a third of the parents who \
drove their children to school said they would let them walk if there were a safer way across.

The idea of a second crossing was not new. A footbridge near the old tannery had been proposed in three \
previous decades and abandoned each time, twice because of cost and once because the landowner on the \
east bank refused to sell. What changed was a combination of three things: the tannery site was finally \
bought by the town, a regional fund for active travel opened a round of grants, and a group of residents \
calling themselves the Crossing Committee collected more than four thousand signatures in a single \
summer. The council agreed to commission a design and to apply for funding, on the condition that the \
project would be reviewed in public after two years of use. This report is that review.

2. Design and construction

The design competition attracted nine entries. The panel, which included two engineers, a landscape \
architect, a representative of the disability forum and a pupil from the secondary school, chose a light \
steel truss with a timber deck and a gentle ramp at each end instead of steps. The ramps added twelve \
metres to the length of the structure and about eight percent to the cost, but the panel judged that a \
bridge which could not be used by wheelchairs, prams and bicycles would fail the very people it was \
meant to serve. The deck is three and a half metres wide, enough for two cyclists to pass a family \
walking side by side, and it is lit at night by low lamps set into the handrail, which keep light off \
the water and away from the bats that roost under the banks.

Construction began in late winter and was planned to take seven months. It took ten. The first delay \
came from the river itself: the spring flood arrived three weeks early and higher than forecast, and the \
temporary platform for the west pier had to be dismantled and rebuilt. The second delay came from the \
ground. Boreholes on the east bank had been drilled at the edge of the tannery site, and when the piling \
crew moved twenty metres north they found an old brick culvert that appeared on no map. Redesigning the \
foundation to bridge the culvert, rather than break it, cost six weeks and a significant sum, but it \
avoided the risk of flooding the cellars of the houses on Tanner's Row, which the culvert still drains. \
The third delay, the shortest, was a national shortage of the particular steel sections the truss \
required. The contractor found an alternative supplier abroad, at a higher price, rather than wait for \
the domestic mill.

3. Costs

The original budget was four point two million. The final cost was five point one million, an overrun of \
a little over twenty-one percent. Of the additional nine hundred thousand, roughly half is explained by \
the culvert and the redesign of the east foundation, a quarter by the flood and the rebuilt platform, \
and the rest by the price of steel and by the extended hire of the crane. The regional fund covered \
sixty percent of the original budget, as promised, but it declined to share in the overrun. The gap was \
closed by delaying the resurfacing of two residential streets by one year and by a contribution from the \
community foundation, which raised a surprising amount from local businesses that expected more \
customers from the east bank.

The committee wishes to be candid about this. An overrun of this size is not unusual for work in and \
around a river, but the council did not hold a contingency reserve large enough to absorb it, and the \
decision to postpone road maintenance was taken quickly and with little public discussion. Residents of \
the two streets concerned were right to complain that they learned of the delay from a notice on a lamp \
post.

4. Use

Automatic counters were installed at both ends of the bridge from the first day. In the first year the \
bridge carried an average of two thousand three hundred crossings a day, and in the second year two \
thousand nine hundred. Use peaks twice on weekdays, between eight and nine in the morning and between \
three and four in the afternoon, which matches the school day closely. Weekend use is lower in the \
morning but much higher in the afternoon, especially in summer, when the riverside path that now \
connects to the bridge has become a popular place to walk. About a third of crossings are made by \
bicycle, a figure that has risen every season.

The counters cannot say who the users are or where they would have gone otherwise, so the committee also \
ran two surveys, one six months after opening and one at eighteen months, each of about six hundred \
people stopped on the bridge or on Market Street. In the second survey, forty-four percent of people on \
the footbridge said they had previously made the same journey by car, twenty-nine percent said they had \
previously walked or cycled across the Stone Bridge, and the remainder said they would not have made the \
journey at all. That last group matters: it includes older residents of the east bank who told the \
interviewers that they now walk into town for the market, the library or the doctor, where before they \
waited for a lift or stayed at home.

5. Effects on traffic and safety

Traffic counts on Market Street fell by about eleven percent at the morning peak, compared with the \
average of the three years before the bridge opened. Outside the peaks the change is small and within \
the normal variation from year to year. The number of cyclists using the Stone Bridge fell by more than \
half, which has made the remaining cycling there noticeably calmer, although the pavement is still too \
narrow. Recorded collisions on Market Street involving a pedestrian or cyclist fell from an average of \
seven a year to three in the first year and two in the second. The numbers are small, and the committee \
does not claim that the bridge alone caused the fall, but the direction is encouraging and matches what \
residents report.

There have been problems on the bridge itself. In the first winter, the timber deck became slippery in \
freezing fog, and two people were hurt in falls. Anti-slip strips were fitted across the whole deck in \
the following spring, and no falls have been reported since. There were also repeated complaints about \
cyclists riding fast down the west ramp, which ends close to the entrance of the primary school. A \
staggered barrier was tried for three months and removed after wheelchair users and parents with double \
prams found it impossible to pass. Painted markings and a sign asking cyclists to slow down were added \
instead, with modest effect. The committee believes this remains the most important unresolved issue.

6. Effects on the town

Shops on the east end of Market Street, previously the quietest part of the high street, report the \
largest change. Of the twenty-two businesses that answered the committee's questionnaire, fifteen said \
trade had increased since the bridge opened, five said it was unchanged and two said it had fallen. Both \
of the latter are on the west side of the Stone Bridge and attribute the fall to fewer drivers stopping \
on their way through. The weekly market has extended its hours on Saturdays and added eleven stalls. The \
tannery site, which had stood empty for thirty years, now holds a small park, a playground and a café in \
the former boiler house, all of which were planned alongside the bridge but funded separately.

Not every effect has been welcome. Residents of Tanner's Row describe evening noise from groups \
gathering at the east end of the bridge, particularly in summer, and some have asked for the lamps to be \
switched off after midnight. Others, including several women who answered the survey, asked for the \
opposite: brighter lighting and a camera, because they use the bridge when returning from late shifts. \
The committee has not found a solution that satisfies both groups and recommends that the council \
consult the residents of Tanner's Row and regular night-time users together rather than separately.

7. Maintenance

The bridge was designed for a life of at least eighty years, with the timber deck expected to need \
replacement every twenty to twenty-five. The first two years have brought only routine work: cleaning \
the drainage channels after the autumn leaf fall, replacing four lamps damaged by vandalism, and \
tightening a small number of deck fixings that worked loose during the first winter. The annual \
maintenance cost has been slightly below the estimate. However, the inspection after the second spring \
flood found scouring around the west pier, where the current has begun to carry away the gravel that \
protects the foundation. The engineers do not consider this an immediate danger, but they advise placing \
rock armour around the pier within the next two years, at an estimated cost of about one hundred and \
eighty thousand.

8. Lessons

The committee draws four lessons from the project. First, ground conditions should be investigated along \
the whole footprint of any structure, not only at the points that are cheapest to reach; the culvert \
would have been found by two additional boreholes costing a few thousand. Second, the council should \
hold a contingency reserve of at least fifteen percent for any work in or near the river, and should \
decide in advance, in public, what will be postponed if that reserve is exhausted. Third, involving \
users early in the design, especially disabled residents and children, produced a bridge that is used \
far more widely than a cheaper design with steps would have been; the extra cost of the ramps is, in the \
committee's view, the best money spent on the project. Fourth, the council communicated well while the \
bridge was being built, with regular updates and open site days, but poorly once decisions about money \
had to be made, and it lost some of the trust it had earned.

9. Recommendations

The committee recommends that the council: fund the rock armour for the west pier in the next budget, \
before the scouring becomes expensive to repair; commission a proper study of the west ramp and the \
school entrance, with the aim of separating fast cycling from children without excluding wheelchair \
users; hold a joint consultation on lighting with the residents of Tanner's Row and night-time users; \
complete the postponed resurfacing of the two residential streets this year as promised, and apologise \
to their residents for the way the delay was announced; and continue the automatic counts and repeat the \
survey every two years, so that the next review can rest on a longer record.

Taken as a whole, the committee concludes that the footbridge has done what it was built to do. It is \
used by more people than forecast, it has made the Stone Bridge safer, and it has brought life back to a \
neglected part of the town. It cost more than planned, and the way the overrun was handled was the \
weakest part of the project. The recommendations above are modest in cost compared with the bridge \
itself, and the committee urges the council to adopt them together rather than one at a time.
"""
